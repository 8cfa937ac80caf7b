// Command mkimage packs one static binary into a single-layer linux/amd64
// image and writes it as an OCI image archive (an OCI layout in a tar, what
// `ctr images import` reads), named by the io.containerd.image.name
// annotation. Only the standard library: the format is a handful of small
// JSON documents around one layer.
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

// blob is one content-addressed file of the layout.
type blob struct {
	mediaType string
	body      []byte
}

func (b blob) digest() string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b.body)) }

func (b blob) descriptor() map[string]any {
	return map[string]any{"mediaType": b.mediaType, "digest": b.digest(), "size": len(b.body)}
}

// write builds the layer (the binary and a world-writable /tmp), the image
// config, the manifest and the index. Timestamps are the epoch, so the same
// binary always gives the same image.
func write(ref, out, bin, entry, user string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	epoch := time.Unix(0, 0).UTC()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: epoch}); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: entry[1:], Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerBlob := blob{"application/vnd.oci.image.layer.v1.tar", layer.Bytes()}
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": []string{entry}, "Env": []string{"PATH=/"}, "User": user},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerBlob.digest()}},
	})
	if err != nil {
		return err
	}
	configBlob := blob{"application/vnd.oci.image.config.v1+json", config}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": configBlob.descriptor(), "layers": []any{layerBlob.descriptor()},
	})
	if err != nil {
		return err
	}
	manifestBlob := blob{"application/vnd.oci.image.manifest.v1+json", manifest}
	desc := manifestBlob.descriptor()
	desc["platform"] = map[string]string{"os": "linux", "architecture": "amd64"}
	desc["annotations"] = map[string]string{"io.containerd.image.name": ref}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []any{desc}})
	if err != nil {
		return err
	}

	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	aw := tar.NewWriter(f)
	files := []struct {
		name string
		body []byte
	}{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}, {"index.json", index}}
	for _, b := range []blob{layerBlob, configBlob, manifestBlob} {
		files = append(files, struct {
			name string
			body []byte
		}{"blobs/sha256/" + b.digest()[len("sha256:"):], b.body})
	}
	for _, file := range files {
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
