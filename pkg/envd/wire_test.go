package envd

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
)

// TestDescriptorsMatchTheSDK proves the wire: the e2b SDK (npm e2b 2.51.0)
// embeds its generated descriptors as base64 FileDescriptorProtos
// (fileDesc("...") in dist/index.js, copied verbatim to testdata), and ours
// must describe the same files: names, packages, messages, fields (name,
// number, type, label, oneof, proto3 optional), enums, services, methods
// and their streaming. Left out of the comparison is only what never goes
// on the wire and the SDK's code generator drops or sets per language:
// file options (go_package here, java_package and friends there), each
// field's json_name (the SDK's generator strips it; it is derived from the
// name either way) and the dependency list (the SDK passes dependencies
// beside the descriptor).
func TestDescriptorsMatchTheSDK(t *testing.T) {
	for _, c := range []struct {
		testdata string
		ours     protoreflect.FileDescriptor
	}{
		{"process.desc.b64", process.File_process_process_proto},
		{"filesystem.desc.b64", filesystem.File_filesystem_filesystem_proto},
	} {
		t.Run(c.testdata, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", c.testdata))
			if err != nil {
				t.Fatal(err)
			}
			raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(strings.TrimSpace(string(b)), "="))
			if err != nil {
				t.Fatalf("decoding the SDK's descriptor: %v", err)
			}
			sdk := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(raw, sdk); err != nil {
				t.Fatalf("parsing the SDK's descriptor: %v", err)
			}
			if len(sdk.GetMessageType()) == 0 || len(sdk.GetService()) != 1 {
				t.Fatalf("the SDK's descriptor %s looks empty: %d messages, %d services", sdk.GetName(), len(sdk.GetMessageType()), len(sdk.GetService()))
			}
			got := protodesc.ToFileDescriptorProto(c.ours)
			if diff := cmp.Diff(normalize(sdk), normalize(got), protocmp.Transform()); diff != "" {
				t.Errorf("%s differs from the SDK's (-sdk +ours):\n%s", sdk.GetName(), diff)
			}
		})
	}
}

// normalize clears what TestDescriptorsMatchTheSDK does not compare.
func normalize(fd *descriptorpb.FileDescriptorProto) *descriptorpb.FileDescriptorProto {
	fd = proto.Clone(fd).(*descriptorpb.FileDescriptorProto)
	fd.Options = nil
	fd.Dependency = nil
	fd.SourceCodeInfo = nil
	var clearMessages func([]*descriptorpb.DescriptorProto)
	clearMessages = func(ms []*descriptorpb.DescriptorProto) {
		for _, m := range ms {
			for _, f := range m.Field {
				f.JsonName = nil
			}
			clearMessages(m.NestedType)
		}
	}
	clearMessages(fd.MessageType)
	return fd
}
