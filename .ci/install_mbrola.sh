#!/usr/bin/env bash
# mbrola and its us1 voice for the synthesis tests. Both live in Debian's contrib/non-free sections,
# which the image's sources do not list: use a private sources file (the machine's own Debian mirror)
# and leave /etc alone (../shared/reference/speech_data.md §1). Failure only warns: the one test that
# needs mbrola then reports itself as skipped.
set -uo pipefail
[ -f /usr/share/mbrola/us1/us1 ] && command -v mbrola >/dev/null && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
# the first active Debian URI (deb822 "URIs:" or one-line "deb" entries; comments skipped)
mirror=$(grep -rhE '^[[:space:]]*(URIs:|deb )' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
         | grep -oE 'https?://[^ ]*debian[^ ]*' | grep -v security | head -1)
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
dir=$(mktemp -d)
mkdir -p "$dir/parts" "$dir/lists/partial" "$dir/cache/archives/partial"
echo "deb ${mirror:-http://deb.debian.org/debian} $suite main contrib non-free" > "$dir/sources.list"
opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=$dir/parts"
      -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache")
if $sudo apt-get "${opts[@]}" update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get "${opts[@]}" install -y -qq \
     --no-install-recommends mbrola mbrola-us1 >/dev/null; then
  echo "mbrola + us1 installed"
else
  echo "WARNING: could not install mbrola (contrib/non-free); the mbrola synthesis test will be skipped" >&2
fi
rm -rf "$dir"
