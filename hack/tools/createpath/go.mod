module github.com/deerflow-sandbox/provisioner/hack/tools/createpath

go 1.26
