#!/usr/bin/env bash
# mbrola with its us1 voice and the nine databases that realtime/train/mbrola_en.py speaks English
# through, Festival with its rab and ked diphone voices, RHVoice's English voices and SVOX Pico
# (realtime/train/pico.py), for the synthesis tests. mbrola, rab, RHVoice and Pico live in Debian's
# contrib/non-free sections, which the image's sources do not list: use a private sources file (the
# machine's own Debian mirror) and leave /etc alone
# (../shared/reference/speech_data.md §1). Failure only warns: the tests that need them then report
# themselves as skipped.
#   bash .ci/install_mbrola.sh [PACKAGE...]   extra packages from the same sections (the training voices:
#                                             benchmarks/rebuild_training_parts.sh); with them nothing is skipped
set -uo pipefail
extra=("$@")
[ ${#extra[@]} -eq 0 ] && [ -f /usr/share/mbrola/us1/us1 ] && command -v mbrola >/dev/null && command -v festival >/dev/null \
  && [ -d /usr/share/festival/voices/english/rab_diphone ] && [ -d /usr/share/festival/voices/english/ked_diphone ] \
  && [ -d /usr/share/RHVoice/voices/bdl ] && [ -e /usr/lib/x86_64-linux-gnu/libRHVoice.so.5 ] \
  && [ -f /usr/share/mbrola/cr1/cr1 ] && command -v pico2wave >/dev/null && exit 0
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
     --no-install-recommends mbrola mbrola-us1 festival festvox-rablpc16k festvox-kdlpc16k librhvoice5 rhvoice-english \
     mbrola-fr2 mbrola-fr3 mbrola-fr5 mbrola-fr6 mbrola-fr7 mbrola-de7 mbrola-es1 mbrola-es2 mbrola-cr1 "${extra[@]}" \
     >/dev/null; then
  echo "mbrola + us1 + the nine databases of realtime/train/mbrola_en.py, festival + rab + ked, RHVoice English installed${extra:+ (and ${extra[*]})}"
else
  echo "WARNING: could not install mbrola/festival/RHVoice (contrib/non-free); their synthesis tests will be skipped" >&2
fi
# apart, so that a mirror without it costs only the Pico tests
if ! DEBIAN_FRONTEND=noninteractive $sudo apt-get "${opts[@]}" install -y -qq --no-install-recommends \
     libttspico-utils >/dev/null; then
  echo "WARNING: could not install SVOX Pico (non-free); its synthesis tests will be skipped" >&2
fi
rm -rf "$dir"
