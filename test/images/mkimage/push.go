package main

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// push builds the image of the binary at bin and pushes it to ref, returning
// the digest of the pushed manifest (what a deploy pins).
func push(ctx context.Context, ref string, insecure bool, bin, entry, user string, opts ...remote.Option) (v1.Hash, error) {
	dst, err := parseRef(ref, insecure)
	if err != nil {
		return v1.Hash{}, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return v1.Hash{}, err
	}
	arch, err := binaryArch(data)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("%s: %w", bin, err)
	}
	img, err := buildImage(data, entry, user, arch)
	if err != nil {
		return v1.Hash{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image digest: %w", err)
	}
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	if err := remote.Write(dst, img, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", dst, err)
	}
	return digest, nil
}

// parseRef parses a push destination: a name and a tag (Docker's defaults
// apply, as for docker push), never a digest, which is what the push
// yields. insecure makes the registry plain HTTP.
func parseRef(ref string, insecure bool) (name.Tag, error) {
	if strings.Contains(ref, "@") {
		return name.Tag{}, fmt.Errorf("-push %q: give a name and tag; the digest comes from the push", ref)
	}
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	tag, err := name.NewTag(ref, opts...)
	if err != nil {
		return name.Tag{}, fmt.Errorf("-push %q: %w", ref, err)
	}
	return tag, nil
}

// binaryArch is the GOARCH of a static Linux ELF binary: the image's
// platform must be the binary's, whatever GOARCH built it. A dynamically
// linked binary is refused: the image holds nothing but the binary.
func binaryArch(data []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("not an ELF binary: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("dynamically linked (build it with CGO_ENABLED=0): the image has no libc")
		}
	}
	switch {
	case f.Class == elf.ELFCLASS64 && f.Machine == elf.EM_X86_64:
		return "amd64", nil
	case f.Class == elf.ELFCLASS64 && f.Machine == elf.EM_AARCH64:
		return "arm64", nil
	}
	return "", fmt.Errorf("%v %v: mkimage -push builds linux/amd64 and linux/arm64 images only", f.Class, f.Machine)
}

// buildImage is the archive's image as go-containerregistry builds it: the
// same layer (gzip-compressed, as registries and their clients expect), the
// same entrypoint, user and environment, OCI media types, every timestamp
// the epoch, for linux/arch.
func buildImage(data []byte, entry, user, arch string) (v1.Image, error) {
	layerBytes, err := layerTar(data, entry)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	base, err = mutate.ConfigFile(base, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: epoch},
		Config:       v1.Config{Entrypoint: []string{entry}, Env: imageEnv, User: user},
		// Append fills in the diff IDs but not the type the OCI spec requires.
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "mkimage " + entry},
	})
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return img, nil
}
