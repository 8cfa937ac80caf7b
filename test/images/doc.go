// Package images holds the programs of the images the real test node runs,
// built here because nothing can be pulled: pause (the Pod sandbox's infra
// process), sandbox (a stand-in for the DeerFlow sandbox image) and mkimage,
// which packs one static binary into an image archive containerd imports.
// hack/images.sh builds them.
package images
