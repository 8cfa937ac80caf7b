// Command provisioner is the main that `func build` scaffolds around New():
// the function served by the Knative func Go runtime (knative.dev/func-go),
// the same runtime the deployed image runs. The tests and benchmarks start
// this binary, so they exercise that runtime too.
package main

import (
	"fmt"
	"os"

	"knative.dev/func-go/http"

	function "github.com/deerflow-sandbox/provisioner"
)

func main() {
	if err := http.Start(function.New()); err != nil {
		fmt.Fprintln(os.Stderr, err.Error())
		os.Exit(1)
	}
}
