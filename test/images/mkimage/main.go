// Command mkimage packs one static binary into a single-layer linux/amd64
// image and writes it as a docker-archive tarball (what `ctr images import`
// reads). Only the standard library: the format is three small files.
//
//	mkimage -ref localhost/sandbox:e2e -out sandbox.tar /path/to/binary
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"
)

func main() {
	ref := flag.String("ref", "", "image reference, e.g. localhost/sandbox:e2e")
	out := flag.String("out", "", "archive to write")
	entry := flag.String("entrypoint", "", "path of the binary in the image (default /<name>)")
	user := flag.String("user", "", "image user, e.g. 65532:65532")
	flag.Parse()
	if *ref == "" || *out == "" || flag.NArg() != 1 {
		log.Fatal("usage: mkimage -ref REF -out FILE [-entrypoint PATH] [-user UID:GID] BINARY")
	}
	bin := flag.Arg(0)
	if *entry == "" {
		*entry = "/" + filepath.Base(bin)
	}
	if err := write(*ref, *out, bin, *entry, *user); err != nil {
		log.Fatal(err)
	}
}

// write builds the layer (the binary and a world-writable /tmp), the image
// config and the docker-archive manifest. Timestamps are the epoch, so the
// same binary always gives the same image id.
func write(ref, out, bin, entry, user string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	epoch := time.Unix(0, 0).UTC()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	hdrs := []*tar.Header{
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: epoch},
		{Name: entry[1:], Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data)), ModTime: epoch},
	}
	for i, h := range hdrs {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if i == 1 {
			if _, err := tw.Write(data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	diffID := fmt.Sprintf("sha256:%x", sha256.Sum256(layer.Bytes()))
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": []string{entry}, "Env": []string{"PATH=/"}, "User": user},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history":      []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "mkimage " + filepath.Base(bin)}},
	})
	if err != nil {
		return err
	}
	configName := fmt.Sprintf("%x.json", sha256.Sum256(config))
	manifest, err := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{ref}, "Layers": []string{"layer.tar"}}})
	if err != nil {
		return err
	}

	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	aw := tar.NewWriter(f)
	for _, file := range []struct {
		name string
		body []byte
	}{{configName, config}, {"layer.tar", layer.Bytes()}, {"manifest.json", manifest}} {
		if err := aw.WriteHeader(&tar.Header{Name: file.name, Mode: 0o644, Size: int64(len(file.body)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := aw.Write(file.body); err != nil {
			return err
		}
	}
	if err := aw.Close(); err != nil {
		return err
	}
	return f.Close()
}
