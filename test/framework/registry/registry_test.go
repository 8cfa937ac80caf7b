package registry

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestPushThenPull: an image pushed by digest and tag comes back by both,
// with its blobs on disk.
func TestPushThenPull(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		s, err := Start("127.0.0.1:0", dir, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		img, err := random.Image(1024, 2)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := name.ParseReference(s.Addr + "/deer-flow/test:e2e")
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatalf("push to the registry (blobs in %q): %v", dir, err)
		}
		want, _ := img.Digest()
		desc, err := remote.Head(ref)
		if err != nil {
			t.Fatal(err)
		}
		if desc.Digest != want {
			t.Errorf("the tag names %s, pushed %s", desc.Digest, want)
		}
		got, err := remote.Image(ref.Context().Digest(want.String()))
		if err != nil {
			t.Fatal(err)
		}
		if layers, err := got.Layers(); err != nil || len(layers) != 2 {
			t.Errorf("pulled %d layers (%v), pushed 2", len(layers), err)
		}
		if dir != "" {
			files, err := filepath.Glob(filepath.Join(dir, "*", "*"))
			if err != nil || len(files) < 3 { // two layers and the config
				t.Errorf("blobs on disk under %s: %v (%v), want the 2 layers and the config", dir, files, err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
