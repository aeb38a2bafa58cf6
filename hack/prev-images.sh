#!/usr/bin/env bash
# The previous release's images, for the end-to-end suite's upgrade step:
# the commit hack/previous-release names, checked out in a worktree of its
# own (fetched from origin where this clone lacks it: a shallow clone), its
# own hack/images.sh run there with every image tagged :prev, and the
# images imported into every node of the local cluster (hack/local-cluster,
# STATE). Prints the worktree's chart directory on the last line; the
# worktree stays until the next run, or `hack/prev-images.sh --clean`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${PREV_DIR:-/var/tmp/rdmavisor-previous}
clean() {
  git worktree remove --force "$dir" >/dev/null 2>&1 || rm -rf "$dir"
  git worktree prune
}
if [ "${1:-}" = --clean ]; then
  clean
  exit 0
fi
commit=$(grep -v '^#' hack/previous-release | head -n 1)
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "prev-images: $commit is not in this clone: fetching it from origin" >&2
  git fetch --quiet origin "$commit" >&2 || git fetch --quiet --unshallow origin >&2
fi
clean
git worktree add --detach "$dir" "$commit" >&2
t=$SECONDS
out=$dir/bin/image # images.sh's default OUT, relative to the worktree
(cd "$dir" && TAG=local.test/rdmavisor:prev ECHO_TAG=local.test/rdmavisor-echo:prev \
  GRPCECHO_TAG=local.test/rdmavisor-grpcecho:prev ECHO_C_TAG=local.test/rdmavisor-echo-c:prev \
  ECHO_PY_TAG=local.test/rdmavisor-echo-py:prev DNS_TAG=local.test/localdns:prev \
  VERSION="prev-${commit:0:12}" hack/images.sh --no-import) >&2
# The agent's and the echo example's images: what the upgrade runs.
for n in $(hack/local-cluster/node.sh list | awk '{print $1}'); do
  hack/local-cluster/node.sh "$n" import "$out"/rdmavisor-*.tar >&2
done
echo "prev-images: ${commit:0:12}'s images built and imported in $((SECONDS - t))s" >&2
echo "$dir/charts/rdmavisor"
