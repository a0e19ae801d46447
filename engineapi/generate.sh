#!/usr/bin/env bash
# Regenerates engineapi/impb from engineapi/proto with protoc (Debian
# protobuf-compiler) and the protoc-gen-go / protoc-gen-go-grpc versions
# pinned as tools in go.mod.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
plugins=$(mktemp -d)
trap 'rm -rf "$plugins"' EXIT
go build -o "$plugins/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$plugins/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
rm -f engineapi/impb/*.pb.go
PATH="$plugins:$PATH" protoc -I engineapi/proto \
  --go_out=engineapi/impb --go_opt=paths=source_relative \
  --go-grpc_out=engineapi/impb --go-grpc_opt=paths=source_relative \
  engineapi/proto/instancemanager.proto
