// Command mkimage packs one static binary into a single-layer image: an OCI
// image archive for the real test node, or an image pushed to a registry
// for a real cluster.
//
// The archive (an OCI layout in a tar, what `ctr images import` reads) is
// linux/amd64, named by the io.containerd.image.name annotation, and written
// with the standard library only: the format is a handful of small JSON
// documents around one layer.
//
//	mkimage -ref localhost/sandbox:e2e -out sandbox.tar /path/to/binary
//
// -push builds the same image (the same layer, user, entrypoint and
// environment) for the binary's own architecture (linux/amd64 or
// linux/arm64, read from its ELF header, so a GOARCH=arm64 build gives an
// arm64 image) with go-containerregistry, pushes it with credentials from
// the default keychain (Docker's config and its helpers) and prints the
// pushed manifest's digest on stdout. -insecure talks plain HTTP to a
// registry that is not on loopback (loopback and private addresses are
// plain HTTP already).
//
//	mkimage -push registry.example.com/team/sandbox-egress-proxy:v1 -user 65532:65532 /path/to/binary
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		log.Fatal(err)
	}
}

const usage = "usage: mkimage -ref REF -out FILE [-entrypoint PATH] [-user UID:GID] BINARY\n" +
	"       mkimage -push REF [-insecure] [-entrypoint PATH] [-user UID:GID] BINARY"

// run parses args and writes the archive, or pushes and prints the digest
// on stdout. The flags' help goes to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ref := fs.String("ref", "", "image reference in the archive, e.g. localhost/sandbox:e2e")
	out := fs.String("out", "", "archive to write")
	pushRef := fs.String("push", "", "push the image to this reference (name:tag) instead of writing an archive")
	insecure := fs.Bool("insecure", false, "with -push: plain HTTP to the registry")
	entry := fs.String("entrypoint", "", "path of the binary in the image (default /<name>)")
	user := fs.String("user", "", "image user, e.g. 65532:65532")
	var adds, links multi
	fs.Var(&adds, "add", "another file, host-path=/image/path (repeatable): e.g. a static shell")
	fs.Var(&links, "link", "a symbolic link, /image/path=target (repeatable): e.g. /bin/sh=busybox")
	path := fs.String("path", "/", "the image's PATH")
	home := fs.String("home", "", "the image user's home directory (absolute), owned by -user, and HOME in the environment")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w\n%s", err, usage)
	}
	extras, err := readExtras(adds, links)
	if err != nil {
		return err
	}
	layerExtras, imageEnv = extras, []string{"PATH=" + *path}
	if layerHome, err = homeOf(*home, *user); err != nil {
		return err
	}
	if *home != "" {
		imageEnv = append(imageEnv, "HOME="+*home)
	}
	archive := *ref != "" || *out != ""
	switch {
	case fs.NArg() != 1:
		return errors.New(usage)
	case *pushRef != "" && archive:
		return fmt.Errorf("-push and -ref/-out exclude each other\n%s", usage)
	case *pushRef == "" && (*ref == "" || *out == ""):
		return errors.New(usage)
	case *insecure && *pushRef == "":
		return fmt.Errorf("-insecure goes with -push\n%s", usage)
	}
	bin := fs.Arg(0)
	if *entry == "" {
		*entry = "/" + filepath.Base(bin)
	}
	if len(*entry) < 2 || (*entry)[0] != '/' {
		return fmt.Errorf("-entrypoint %q: want an absolute path", *entry)
	}
	if *pushRef == "" {
		return write(*ref, *out, bin, *entry, *user)
	}
	digest, err := push(ctx, *pushRef, *insecure, bin, *entry, *user)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, digest)
	return err
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

// epoch is every timestamp in the image, so the same binary always gives
// the same image.
var epoch = time.Unix(0, 0).UTC()

// imageEnv is the image's environment: the binary sits at the root.
var imageEnv = []string{"PATH=/"}

// multi is a repeatable flag.
type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// extra is a file (data) or a symbolic link (link) the layer holds beside
// the binary, at name (absolute).
type extra struct {
	name, link string
	data       []byte
}

// layerExtras are the -add and -link entries of this run.
var layerExtras []extra

// home is a directory the image's user owns (-home), as an image made
// for E2B's SDK has (user "user", home /home/user).
type home struct {
	path     string
	uid, gid int
}

// layerHome is this run's -home ("" path: none).
var layerHome home

func homeOf(path, user string) (home, error) {
	if path == "" {
		return home{}, nil
	}
	if !strings.HasPrefix(path, "/") || len(path) < 2 || strings.HasSuffix(path, "/") {
		return home{}, fmt.Errorf("-home %q: want an absolute path", path)
	}
	u, g, ok := strings.Cut(user, ":")
	uid, uerr := strconv.Atoi(u)
	gid, gerr := strconv.Atoi(g)
	if !ok || uerr != nil || gerr != nil {
		return home{}, fmt.Errorf("-home needs -user UID:GID (numbers) to own it, not %q", user)
	}
	return home{path: path, uid: uid, gid: gid}, nil
}

func readExtras(adds, links []string) ([]extra, error) {
	var out []extra
	for _, a := range adds {
		src, dst, ok := strings.Cut(a, "=")
		if !ok || !strings.HasPrefix(dst, "/") || len(dst) < 2 {
			return nil, fmt.Errorf("-add %q: want host-path=/image/path", a)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("-add: %w", err)
		}
		out = append(out, extra{name: dst, data: data})
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, "=")
		if !ok || !strings.HasPrefix(dst, "/") || len(dst) < 2 || target == "" {
			return nil, fmt.Errorf("-link %q: want /image/path=target", l)
		}
		out = append(out, extra{name: dst, link: target})
	}
	return out, nil
}

// layerTar is the image's one layer, uncompressed: a world-writable /tmp,
// the binary at entry (absolute), mode 0755, and the extras, each under
// its parent directories (0755).
func layerTar(data []byte, entry string) ([]byte, error) {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: epoch}); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	dirs := map[string]bool{"tmp": true}
	if h := layerHome; h.path != "" {
		name := h.path[1:]
		for _, d := range parents(name, dirs) {
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, fmt.Errorf("layer: %w", err)
			}
		}
		dirs[name] = true
		if err := tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: h.uid, Gid: h.gid, ModTime: epoch}); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
	}
	for _, e := range layerExtras {
		name := e.name[1:]
		for _, d := range parents(name, dirs) {
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, fmt.Errorf("layer: %w", err)
			}
		}
		h := &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(e.data)), ModTime: epoch}
		if e.link != "" {
			h = &tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: e.link, Mode: 0o777, ModTime: epoch}
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer: %w", err)
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: entry[1:], Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(data)), ModTime: epoch}); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	if _, err := tw.Write(data); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return layer.Bytes(), nil
}

// parents are name's parent directories not in dirs yet, outermost
// first, which it adds to dirs.
func parents(name string, dirs map[string]bool) []string {
	var out []string
	for d := filepath.Dir(name); d != "." && !dirs[d]; d = filepath.Dir(d) {
		dirs[d] = true
		out = append([]string{d}, out...)
	}
	return out
}

// write builds the layer, the image config, the manifest and the index.
func write(ref, out, bin, entry, user string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	layer, err := layerTar(data, entry)
	if err != nil {
		return err
	}
	layerBlob := blob{"application/vnd.oci.image.layer.v1.tar", layer}
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": []string{entry}, "Env": imageEnv, "User": user},
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

	// Into a temporary file beside out, renamed into place when whole: the
	// scripts take an archive that exists for a cached one, so an archive an
	// interrupted run left half-written must never appear under out's name.
	f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
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
	if err := f.Chmod(0o644); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}
