# Shared by the scripts that build the local images (scripts/local-*-image):
# root file systems made with debootstrap from the Debian archive this
# machine's apt uses, imported into Docker as single-layer images. Nothing
# comes from an image registry. Source it; it defines functions only.

# local_image_cache is where debootstrap keeps the packages it downloads,
# so that a rebuild downloads nothing.
local_image_cache=${RELAY_LOCAL_IMAGE_CACHE:-/var/cache/relay-local-images}

# local_image_suite is the Debian release every local image is made of:
# the one the official postgres:15 and golang images are built on.
local_image_suite=bookworm

# local_image_epoch is the modification time of every file in a local
# image's layer, so that the same packages give the same layer.
local_image_epoch=0

# docker is the CLI that DOCKER names, else the one on PATH.
docker() { command "${DOCKER:-docker}" "$@"; }

die() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

# debian_mirror prints the Debian archive this machine's apt installs from
# (DEBIAN_MIRROR overrides it).
debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then
    printf '%s\n' "$DEBIAN_MIRROR"
    return
  fi
  local m=
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    # deb822: the first URIs line that is not the security archive.
    m=$(awk '$1 == "URIs:" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$m" ] && [ -f /etc/apt/sources.list ]; then
    m=$(awk '$1 == "deb" && $2 !~ /security/ && $2 ~ /^https?:/ { print $2; exit }' /etc/apt/sources.list)
  fi
  [ -n "$m" ] || die "no Debian archive found in /etc/apt (set DEBIAN_MIRROR)"
  printf '%s\n' "$m"
}

# recipe_hash prints a digest of the files that define an image: the
# scripts (and whatever else is named). An image whose relay.recipe label
# holds it is current.
recipe_hash() {
  cat "$@" | sha256sum | cut -c1-16
}

# image_is_current NAME HASH succeeds when image NAME exists and was built
# from the recipe HASH.
image_is_current() {
  local have
  have=$(docker image inspect --format '{{ index .Config.Labels "relay.recipe" }}' "$1" 2>/dev/null) || return 1
  [ "$have" = "$2" ]
}

# make_rootfs DIR PACKAGES... debootstraps a minimal Debian (the minbase
# variant: essential packages and apt) with PACKAGES into DIR.
make_rootfs() {
  local dir=$1
  shift
  local include
  include=$(IFS=,; printf '%s' "$*")
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  mkdir -p "$local_image_cache"
  debootstrap --variant=minbase ${include:+--include="$include"} --cache-dir="$local_image_cache" \
    "$local_image_suite" "$dir" "$(debian_mirror)" >"$dir.debootstrap.log" 2>&1 ||
    die "debootstrap failed; its log: $dir.debootstrap.log"
  rm -f "$dir.debootstrap.log"
}

# strip_rootfs DIR removes what differs from one debootstrap to the next
# (logs, caches, keys generated at install) and what no container needs
# (documentation, manual pages, apt's package lists).
strip_rootfs() {
  local dir=$1
  rm -rf "$dir"/var/log/* "$dir"/var/cache/apt/* "$dir"/var/cache/debconf/*-old \
    "$dir"/var/cache/ldconfig/aux-cache "$dir"/var/lib/apt/lists/* \
    "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/* \
    "$dir"/usr/share/locale/* "$dir"/tmp/* "$dir"/var/tmp/* "$dir"/root/.* \
    "$dir"/dev/* "$dir"/proc/* "$dir"/sys/* "$dir"/run/* 2>/dev/null || true
  : >"$dir/etc/machine-id"
  # The date each user was last changed (days since 1970) is the build's.
  sed -i 's/^\([^:]*:[^:]*:\)[0-9]*:/\1'"$((local_image_epoch / 86400))"':/' "$dir/etc/shadow"
}

# import_rootfs DIR NAME INSTRUCTIONS... makes image NAME of DIR: one
# layer in which every file has the same owner numbers and modification
# time and the files come in name order, with the Dockerfile INSTRUCTIONS
# (ENV, ENTRYPOINT, CMD, USER, WORKDIR, LABEL, EXPOSE, STOPSIGNAL) applied
# over it by a build that adds no layer. It prints the layer's digest,
# which the same files always give.
import_rootfs() {
  local dir=$1 name=$2
  shift 2
  local layer
  layer=$(tar -C "$dir" --sort=name --numeric-owner --mtime="@$local_image_epoch" --format=gnu -c . | docker import -) ||
    die "docker import for $name failed"
  # The classic builder: it needs nothing but the image just imported.
  # Its deprecation notice is no news: its output is shown only on failure.
  local out
  out=$({ printf 'FROM %s\n' "$layer"; printf '%s\n' "$@"; } |
    DOCKER_BUILDKIT=0 docker build --quiet --tag "$name" - 2>&1) ||
    die "docker build $name failed: $out"
  docker image inspect --format '{{ index .RootFS.Layers 0 }}' "$name"
}
