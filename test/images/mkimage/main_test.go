package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fakeELF is the smallest ELF file debug/elf reads: a 64-bit little-endian
// executable header for machine, with one program header, PT_INTERP when
// dynamic (a dynamically linked binary) and PT_LOAD otherwise, and a tail
// that stands for the code.
func fakeELF(t *testing.T, class elf.Class, machine elf.Machine, dynamic bool) []byte {
	t.Helper()
	var ident [elf.EI_NIDENT]byte
	copy(ident[:], elf.ELFMAG)
	ident[elf.EI_CLASS] = byte(class)
	ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	prog := elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X)}
	if dynamic {
		prog.Type = uint32(elf.PT_INTERP)
	}
	var buf bytes.Buffer
	for _, v := range []any{
		elf.Header64{
			Ident: ident, Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
			Phoff: 64, Ehsize: 64, Phentsize: 56, Phnum: 1,
		},
		prog,
	} {
		if err := binary.Write(&buf, binary.LittleEndian, v); err != nil {
			t.Fatal(err)
		}
	}
	buf.WriteString("the proxy's code for " + machine.String())
	return buf.Bytes()
}

func TestBinaryArch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    func(t *testing.T) []byte
		want    string
		wantErr string
	}{
		{"amd64", func(t *testing.T) []byte { return fakeELF(t, elf.ELFCLASS64, elf.EM_X86_64, false) }, "amd64", ""},
		{"arm64", func(t *testing.T) []byte { return fakeELF(t, elf.ELFCLASS64, elf.EM_AARCH64, false) }, "arm64", ""},
		{"dynamic", func(t *testing.T) []byte { return fakeELF(t, elf.ELFCLASS64, elf.EM_X86_64, true) }, "", "dynamically linked"},
		{"riscv64", func(t *testing.T) []byte { return fakeELF(t, elf.ELFCLASS64, elf.EM_RISCV, false) }, "", "linux/amd64 and linux/arm64 images only"},
		{"corrupt header", func(t *testing.T) []byte { return fakeELF(t, elf.ELFCLASS32, elf.EM_X86_64, false) }, "", "not an ELF binary"},
		{"a script", func(*testing.T) []byte { return []byte("#!/bin/sh\nexit 0\n") }, "", "not an ELF binary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := binaryArch(tc.data(t))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("binaryArch = %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("binaryArch = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestParseRef(t *testing.T) {
	for _, tc := range []struct {
		ref      string
		insecure bool
		want     string // the registry's scheme and the full reference
		wantErr  bool
	}{
		{ref: "registry.example.com/team/sandbox-egress-proxy:v1", want: "https registry.example.com/team/sandbox-egress-proxy:v1"},
		{ref: "registry.example.com:5000/proxy:v1", insecure: true, want: "http registry.example.com:5000/proxy:v1"},
		// go-containerregistry speaks plain HTTP to loopback by itself.
		{ref: "127.0.0.1:5001/deer-flow/sandbox-egress-proxy:local", want: "http 127.0.0.1:5001/deer-flow/sandbox-egress-proxy:local"},
		{ref: "team/proxy", want: "https index.docker.io/team/proxy:latest"},
		{ref: "registry.example.com/proxy@sha256:" + strings.Repeat("a", 64), wantErr: true},
		{ref: "Registry.example.com/UPPER:v1", wantErr: true},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			tag, err := parseRef(tc.ref, tc.insecure)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("parseRef(%q) = %v, want an error", tc.ref, tag)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tag.Context().Registry.Scheme() + " " + tag.Name(); got != tc.want {
				t.Errorf("parseRef(%q) = %q, want %q", tc.ref, got, tc.want)
			}
		})
	}
}

func TestRunRefusesBadArguments(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "proxy")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no binary", []string{"-push", "127.0.0.1:1/proxy:t"}, "usage"},
		{"archive without -out", []string{"-ref", "localhost/proxy:e2e", bin}, "usage"},
		{"both modes", []string{"-push", "127.0.0.1:1/proxy:t", "-out", "x.tar", bin}, "exclude each other"},
		{"insecure without push", []string{"-insecure", "-ref", "localhost/proxy:e2e", "-out", "x.tar", bin}, "-insecure goes with -push"},
		{"relative entrypoint", []string{"-push", "127.0.0.1:1/proxy:t", "-entrypoint", "proxy", bin}, "absolute path"},
		{"unknown flag", []string{"-platform", "linux/amd64", bin}, "usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), tc.args, &out, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%q) = %v, want an error with %q", tc.args, err, tc.want)
			}
		})
	}
}

// TestPushIsTheArchiveImage pushes a binary with -push to a registry served
// in this process, pulls it back by the printed digest and checks what the
// deploy relies on: the platform is the binary's, the config runs the binary
// as the user given, and the one layer is the archive's layer byte for byte
// (the same diff ID) holding the binary and /tmp.
func TestPushIsTheArchiveImage(t *testing.T) {
	// No credentials of this machine's user: the keychain finds none.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	for _, tc := range []struct {
		arch    string
		machine elf.Machine
		args    []string
		entry   string
		path    string
		extra   map[string]string
	}{
		{"amd64", elf.EM_X86_64, nil, "/proxy", "/", nil},
		{"arm64", elf.EM_AARCH64, []string{"-insecure", "-entrypoint", "/bin/egress"}, "/bin/egress", "/", nil},
		// A shell beside the binary, as the E2B sandbox stand-in has.
		{"amd64-with-shell", elf.EM_X86_64, []string{"-add", "SHELL=/usr/bin/bash", "-link", "/bin/sh=../usr/bin/bash", "-path", "/bin:/usr/bin:/"}, "/proxy", "/bin:/usr/bin:/",
			map[string]string{"usr/": "dir 755", "usr/bin/": "dir 755", "usr/bin/bash": "file 755 #!shell", "bin/": "dir 755", "bin/sh": "link ../usr/bin/bash"}},
		// A home the image's user owns, as E2B's user model has.
		{"amd64-with-home", elf.EM_X86_64, []string{"-home", "/home/user"}, "/proxy", "/",
			map[string]string{"home/": "dir 755", "home/user/": "dir 755 owned 65532:65532"}},
	} {
		t.Run(tc.arch, func(t *testing.T) {
			dir := t.TempDir()
			bin := filepath.Join(dir, "proxy")
			data := fakeELF(t, elf.ELFCLASS64, tc.machine, false)
			if err := os.WriteFile(bin, data, 0o755); err != nil {
				t.Fatal(err)
			}
			shell := filepath.Join(dir, "bash")
			if err := os.WriteFile(shell, []byte("#!shell"), 0o755); err != nil {
				t.Fatal(err)
			}
			for i, a := range tc.args {
				tc.args[i] = strings.ReplaceAll(a, "SHELL", shell)
			}
			ref := host + "/deer-flow/sandbox-egress-proxy:" + tc.arch
			var stdout bytes.Buffer
			args := append(append([]string{"-push", ref, "-user", "65532:65532"}, tc.args...), bin)
			if err := run(context.Background(), args, &stdout, io.Discard); err != nil {
				t.Fatal(err)
			}
			digest, err := v1.NewHash(strings.TrimSpace(stdout.String()))
			if err != nil {
				t.Fatalf("mkimage printed %q, want a digest: %v", stdout.String(), err)
			}

			tag, err := name.NewTag(ref)
			if err != nil {
				t.Fatal(err)
			}
			tagged, err := remote.Head(tag)
			if err != nil {
				t.Fatal(err)
			}
			if tagged.Digest != digest || tagged.MediaType != types.OCIManifestSchema1 {
				t.Errorf("the tag names %s (%s), mkimage printed %s; want the same OCI manifest", tagged.Digest, tagged.MediaType, digest)
			}
			img, err := remote.Image(tag.Context().Digest(digest.String()))
			if err != nil {
				t.Fatalf("pull by the printed digest: %v", err)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			type platformAndConfig struct {
				OS, Architecture, RootFSType string
				Config                       v1.Config
			}
			env := []string{"PATH=" + tc.path}
			if slices.Contains(tc.args, "-home") {
				env = append(env, "HOME=/home/user")
			}
			want := platformAndConfig{"linux", strings.Split(tc.arch, "-")[0], "layers", v1.Config{Entrypoint: []string{tc.entry}, Env: env, User: "65532:65532"}}
			if diff := cmp.Diff(want, platformAndConfig{cfg.OS, cfg.Architecture, cfg.RootFS.Type, cfg.Config}); diff != "" {
				t.Errorf("pushed image's config (-want +got):\n%s", diff)
			}

			layers, err := img.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("pushed image has layers %v (%v), want one", layers, err)
			}
			files := layerFiles(t, layers[0])
			wantFiles := map[string]string{"tmp/": "dir 1777", tc.entry[1:]: "file 755 " + string(data)}
			maps.Copy(wantFiles, tc.extra)
			if diff := cmp.Diff(wantFiles, files); diff != "" {
				t.Errorf("pushed layer's files (-want +got):\n%s", diff)
			}

			// The archive for the test node holds the same layer.
			archive := filepath.Join(dir, "proxy.tar")
			if err := run(context.Background(), append(append([]string{"-ref", "localhost/sandbox-egress-proxy:e2e", "-out", archive, "-user", "65532:65532", "-entrypoint", tc.entry},
				slices.DeleteFunc(slices.Clone(tc.args), func(a string) bool { return a == "-insecure" })...), bin), io.Discard, io.Discard); err != nil {
				t.Fatal(err)
			}
			if got, want := archiveDiffIDs(t, archive), cfg.RootFS.DiffIDs; len(want) != 1 || cmp.Diff([]string{want[0].String()}, got) != "" {
				t.Errorf("archive's diff IDs %v, pushed image's %v: want the same layer", got, want)
			}
		})
	}
}

// layerFiles lists a layer's entries: kind, permission bits and, for files,
// their content.
func layerFiles(t *testing.T, layer v1.Layer) map[string]string {
	t.Helper()
	rc, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			files[h.Name] = fmt.Sprintf("dir %o", h.Mode)
			if h.Uid != 0 || h.Gid != 0 {
				files[h.Name] += fmt.Sprintf(" owned %d:%d", h.Uid, h.Gid)
			}
		case tar.TypeSymlink:
			files[h.Name] = "link " + h.Linkname
		case tar.TypeReg:
			body, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = fmt.Sprintf("file %o %s", h.Mode, body)
		default:
			files[h.Name] = "type " + string(h.Typeflag)
		}
	}
}

// archiveDiffIDs reads the image config's diff IDs out of an archive
// mkimage wrote.
func archiveDiffIDs(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		blobs[h.Name] = body
	}
	var index struct{ Manifests []struct{ Digest string } }
	var manifest struct{ Config struct{ Digest string } }
	var config struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	blob := func(digest string) []byte { return blobs["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")] }
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("archive's index.json: %v", err)
	}
	if err := json.Unmarshal(blob(index.Manifests[0].Digest), &manifest); err != nil {
		t.Fatalf("archive's manifest: %v", err)
	}
	if err := json.Unmarshal(blob(manifest.Config.Digest), &config); err != nil {
		t.Fatalf("archive's config: %v", err)
	}
	return config.RootFS.DiffIDs
}
