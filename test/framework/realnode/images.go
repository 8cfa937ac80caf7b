package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// importImages loads the images built here and pins them: they can never be
// pulled again, so image garbage collection must not delete them.
// ProxyImage is the egress proxy's image, built from cmd/proxy by
// hack/proxy-image.sh.
const ProxyImage = "localhost/sandbox-egress-proxy:e2e"

// The E2B parts, built here: the agent (cmd/envd, hack/envd-image.sh), the
// router (cmd/router, hack/router-image.sh), and the sandbox stand-in with
// a shell beside it (hack/node-images.sh), which E2B's SDK needs: it runs
// every command as /bin/bash -l -c.
const (
	EnvdImage         = "localhost/sandbox-envd:e2e"
	RouterImage       = "localhost/sandbox-router:e2e"
	ShellSandboxImage = "localhost/sandbox-shell:e2e"
)

func (n *Node) importImages(ctx context.Context) error {
	for _, img := range []struct{ file, ref string }{
		{"pause.tar", "localhost/pause:e2e"},
		{"sandbox.tar", SandboxImage},
		{"kube-network-policies.tar", policyAgentImage()},
		{"proxy.tar", ProxyImage},
		{"envd.tar", EnvdImage},
		{"router.tar", RouterImage},
		{"sandbox-shell.tar", ShellSandboxImage},
	} {
		if _, err := n.ctr(ctx, "images", "import", "--platform", "linux/amd64", filepath.Join(n.paths.ImagesDir, img.file)); err != nil {
			return err
		}
	}
	for _, archive := range n.opts.Images {
		if _, err := n.ctr(ctx, "images", "import", "--platform", "linux/amd64", archive); err != nil {
			return err
		}
	}
	out, err := n.ctr(ctx, "images", "list", "--quiet")
	if err != nil {
		return err
	}
	for _, ref := range strings.Fields(string(out)) {
		if _, err := n.ctr(ctx, "images", "label", ref, "io.cri-containerd.pinned=pinned"); err != nil {
			return err
		}
	}
	return nil
}

// ImportOCILayout imports an OCI image layout directory (as func's host
// builder writes it) into the node's runtime as ref, pinned.
func (n *Node) ImportOCILayout(ctx context.Context, dir, ref string) error {
	archive := filepath.Join(n.State, "import.tar")
	if err := run(ctx, "tar", "-C", dir, "-cf", archive, "."); err != nil {
		return err
	}
	defer os.Remove(archive)
	if _, err := n.ctr(ctx, "images", "import", "--platform", "linux/amd64", "--index-name", ref, archive); err != nil {
		return err
	}
	_, err := n.ctr(ctx, "images", "label", ref, "io.cri-containerd.pinned=pinned")
	return err
}

// ImportArchive imports an image archive (docker save or OCI) into the
// node's runtime and pins ref, which the archive must hold: an operator's
// own sandbox image, which nothing on this machine can pull.
func (n *Node) ImportArchive(ctx context.Context, archive, ref string) error {
	if _, err := n.ctr(ctx, "images", "import", "--platform", "linux/amd64", archive); err != nil {
		return err
	}
	if _, err := n.ctr(ctx, "images", "label", ref, "io.cri-containerd.pinned=pinned"); err != nil {
		return fmt.Errorf("%s holds no image %s: %w", archive, ref, err)
	}
	return nil
}

// extractEntrypoint copies the one executable of a single-layer OCI image
// archive (as test/images/mkimage writes them) to dst: the layer is the blob
// that reads as a tar holding an executable file.
func extractEntrypoint(archive, dst string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return fmt.Errorf("%s: no layer with an executable: %w", archive, err)
		}
		if !strings.HasPrefix(h.Name, "blobs/sha256/") {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		lr := tar.NewReader(bytes.NewReader(body))
		for {
			lh, err := lr.Next()
			if err != nil {
				break // not a layer, or no executable in it
			}
			if lh.Typeflag == tar.TypeReg && lh.Mode&0o111 != 0 {
				b, err := io.ReadAll(lr)
				if err != nil {
					return err
				}
				return os.WriteFile(dst, b, 0o755)
			}
		}
	}
}
