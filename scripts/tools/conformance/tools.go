//go:build tools

// Package tools records what this module builds, so `go mod tidy` keeps
// their dependencies: the e2e suite (built with `go test -c`, so its test
// files' imports are listed too) and the ginkgo CLI.
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/e2e/storage/external"
)
