#!/usr/bin/env bash
# Regenerates the Go code of the driver contracts and the domain spec from their .proto files.
# protoc comes from Debian's protobuf-compiler (make tools); the Go plugins are pinned tools in
# hack/tools/go.mod.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
GOWORK=off go build -modfile=hack/tools/go.mod -o "$bin/" \
  google.golang.org/protobuf/cmd/protoc-gen-go \
  google.golang.org/grpc/cmd/protoc-gen-go-grpc

mapfile -t protos < <(find core -name '*.proto' | sort)
PATH="$bin:$PATH" protoc -I . -I /usr/include \
  --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  "${protos[@]}"
