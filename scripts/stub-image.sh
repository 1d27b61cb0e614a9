#!/usr/bin/env bash
# Builds caw-box-test/stub-model:latest (or the tag CAW_BOX_TEST_STUB_IMAGE names: a branch's own
# stub beside the shared one) from the freshly built stub binary (test scaffolding:
# the product itself never shells out to docker).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p stub-model --quiet
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp tests/stub-model/Dockerfile target/debug/stub-model "$ctx/"
docker build -q 2>/dev/null --label io.caw-box.test=stub-image \
    --build-arg BASE=caw-box-local/node:20-bookworm \
    -t "${CAW_BOX_TEST_STUB_IMAGE:-caw-box-test/stub-model:latest}" "$ctx" >/dev/null
