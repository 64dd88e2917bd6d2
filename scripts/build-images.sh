#!/usr/bin/env bash
# Build the project's container images, tagged by a hash of what goes into them:
#   serving         serving/Dockerfile            -> mnist-embedding-serving         (KServe predictor, TorchServe)
#   serving-python  serving/Dockerfile --target python -> mnist-embedding-serving-python (the same, no Java)
#   pipeline        Dockerfile                    -> mnist-embedding-pipeline        (every Kubeflow task)
#
# Usage: scripts/build-images.sh [--push REGISTRY/PREFIX] [--tag T] [--engine docker|podman]
#          [--only serving|serving-python|pipeline] [--torch-index URL|none] [--find-links DIR] [--ca-bundle FILE]
#          [--local-base] [--runtime RUNTIME] [--quiet]
#
#   --push PREFIX     name the images PREFIX/mnist-embedding-<image> and push every tag; the pushed
#                     digest lands in build/images.json. Without it: localhost/mnist-embedding-<image>.
#   --tag T           a second tag (e.g. 0.1.0) besides the content tag h-<12 hex>.
#   --engine E        docker or podman; default: docker if its daemon answers, else podman.
#   --only IMAGE      build one image.
#   --torch-index U   extra pip index for torch (default: the Dockerfiles' PyTorch CPU index;
#                     none with --find-links). E.g. https://download.pytorch.org/whl/cu126 for CUDA.
#   Machine-specific options (podman; docker build cannot mount host files):
#   --find-links DIR  mount a local wheel directory into the build (pip --find-links).
#   --ca-bundle FILE  mount this CA bundle into the build and make pip trust it (PIP_CERT), for
#                     TLS-intercepting proxies; it does not end up in the image. With either option
#                     the build uses the host network.
#   --local-base      without a registry: if debian:bookworm-slim is not present, make it with
#                     mmdebstrap (minbase + ca-certificates, about 35 s) and import it under that name.
#   --runtime R       podman OCI runtime (e.g. runc where crun fails on hybrid cgroups); writes
#                     build/containers.conf (runtime, ulimits within this shell's hard limits) and uses
#                     it through CONTAINERS_CONF for every podman call.
#   --quiet           print only the result lines.
#
# An image whose content tag already exists locally is not rebuilt ("cached"). The engine's layer cache
# makes a source-only change rebuild just the final COPY layers. Build output goes to
# build/<image>-build.log (its tail is printed on failure). Results: one line per image and
# build/images.json ({"engine", "containers_conf", "serving": {ref, tags, id, digest, size_bytes, built,
# seconds}, "pipeline": {...}}), which tests read to run containers with the same engine and settings.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PROG=build-images

die() { echo "$PROG: $*" >&2; exit 1; }
say() { [ "$QUIET" = 1 ] || echo "$PROG: $*" >&2; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

PUSH="" EXTRA_TAG="" ENGINE="" ONLY="" FIND_LINKS="" CA_BUNDLE="" LOCAL_BASE=0 RUNTIME="" QUIET=0
TORCH_INDEX=""
BASE_REF=docker.io/library/debian:bookworm-slim
# Build-time mount points. /mnt exists (empty) in Debian, so mounting the wheel directory there leaves
# nothing behind; the CA bundle goes beside the system's, not over it: ca-certificates' postinst
# replaces /etc/ssl/certs/ca-certificates.crt, which fails on a bind-mounted file.
WHEELS_TARGET=/mnt
CA_TARGET=/run/build-ca.crt

# Accept both "--opt value" and "--opt=value".
args=()
for a in "$@"; do
  case $a in --*=*) args+=("${a%%=*}" "${a#*=}") ;; *) args+=("$a") ;; esac
done
set -- ${args[@]+"${args[@]}"}
while [ $# -gt 0 ]; do
  opt=$1
  case $opt in
    --push|--tag|--engine|--only|--find-links|--ca-bundle|--runtime|--torch-index)
      [ $# -ge 2 ] && [ -n "$2" ] && [[ $2 != --* ]] || die "$opt needs a value (see --help)"
      val=$2; shift 2 ;;
    --local-base) LOCAL_BASE=1; shift; continue ;;
    --quiet|-q) QUIET=1; shift; continue ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option: $opt (see --help)" ;;
  esac
  case $opt in
    --push) PUSH=${val%/}
            [[ $PUSH =~ ^[a-z0-9]([a-z0-9._:/-]*[a-z0-9])?$ ]] || die "--push: not a lowercase REGISTRY/PREFIX: $val" ;;
    --tag) [[ $val =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "--tag: not a valid image tag: $val"
           EXTRA_TAG=$val ;;
    --engine) [[ $val == docker || $val == podman ]] || die "--engine must be docker or podman, not: $val"
              ENGINE=$val ;;
    --only) [[ $val == serving || $val == serving-python || $val == pipeline ]] \
              || die "--only must be serving, serving-python or pipeline, not: $val"
            ONLY=$val ;;
    --find-links) [ -d "$val" ] || die "--find-links: no such directory: $val"
                  FIND_LINKS=$(cd "$val" && pwd) ;;
    --ca-bundle) [ -f "$val" ] && [ -r "$val" ] || die "--ca-bundle: no readable file: $val"
                 CA_BUNDLE=$(cd "$(dirname "$val")" && pwd)/$(basename "$val") ;;
    --runtime) command -v "$val" >/dev/null 2>&1 || die "--runtime: $val is not installed"
               RUNTIME=$val ;;
    --torch-index) [[ $val == none || $val =~ ^https?:// || $val =~ ^file:// ]] \
                     || die "--torch-index must be a URL or none, not: $val"
                   TORCH_INDEX=$val ;;
  esac
done

mkdir -p build

# --- engine -----------------------------------------------------------------------------------------
if [ -n "$RUNTIME" ]; then
  [ "$ENGINE" != docker ] || die "--runtime is a podman option"
  # Containers may not raise rlimits (podman's default nofile is 1048576), so stay at or below this
  # shell's hard limits; nproc above about 40000 was refused here even under a hard limit of 96365.
  hard() { local h; h=$(ulimit -H "$1"); { [ "$h" = unlimited ] || [ "$h" -gt "$2" ]; } && h=$2; echo "$h"; }
  nofile=$(hard -n 65536) nproc=$(hard -u 16384)
  cat > build/containers.conf <<EOF
# Written by scripts/build-images.sh --runtime $RUNTIME; used through CONTAINERS_CONF.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "$RUNTIME"
EOF
  export CONTAINERS_CONF=$ROOT/build/containers.conf
fi

docker_ok() { command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1; }
podman_ok() { command -v podman >/dev/null 2>&1 && timeout 60 podman info >/dev/null 2>&1; }
if [ -z "$ENGINE" ]; then
  if docker_ok; then ENGINE=docker
  elif podman_ok; then ENGINE=podman
  else die "no container engine: docker's daemon does not answer and podman is missing or broken (scripts/system-deps.sh installs podman)"
  fi
elif [ "$ENGINE" = docker ]; then docker_ok || die "docker does not answer (docker info failed); try --engine podman"
else podman_ok || die "podman does not work here (podman info failed)"
fi
if [ "$ENGINE" = docker ] && { [ -n "$FIND_LINKS" ] || [ -n "$CA_BUNDLE" ]; }; then
  die "--find-links/--ca-bundle mount host files into the build, which docker build cannot do; use --engine podman"
fi
E=$ENGINE

# --- base image -------------------------------------------------------------------------------------
if [ "$LOCAL_BASE" = 1 ] && ! $E image inspect "$BASE_REF" >/dev/null 2>&1; then
  command -v mmdebstrap >/dev/null 2>&1 || die "--local-base needs mmdebstrap (apt-get install mmdebstrap)"
  say "making $BASE_REF with mmdebstrap (log: build/base-build.log)"
  tar=build/debian-bookworm-minbase.tar
  t0=$(date +%s)
  if ! mmdebstrap --variant=minbase --include=ca-certificates bookworm "$tar" \
         "deb http://deb.debian.org/debian bookworm main" \
         "deb http://deb.debian.org/debian bookworm-updates main" \
         "deb http://deb.debian.org/debian-security bookworm-security main" >build/base-build.log 2>&1 \
     || ! $E import --change 'CMD ["bash"]' \
              --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
              "$tar" "$BASE_REF" >>build/base-build.log 2>&1; then
    rm -f "$tar"; tail -n 20 build/base-build.log >&2; die "could not make the local base image (build/base-build.log)"
  fi
  rm -f "$tar"
  say "made $BASE_REF in $(( $(date +%s) - t0 )) s"
fi

# --- inputs and content hash ------------------------------------------------------------------------
dockerfile_of() { case $1 in serving|serving-python) echo serving/Dockerfile ;; pipeline) echo Dockerfile ;; esac; }
lock_of() { case $1 in serving|serving-python) echo requirements/serving.lock ;; pipeline) echo requirements/product.lock ;; esac; }
# The Dockerfile's stage each image is (serving/Dockerfile's two targets share every layer but the last few).
target_of() { case $1 in serving) echo torchserve ;; serving-python) echo python ;; *) echo "" ;; esac; }

# Source paths of the Dockerfile's COPY instructions (shell form, one line each).
copy_sources() {
  grep -qiE '^[[:space:]]*COPY[[:space:]].*\[' "$1" && die "$1: JSON-form COPY is not supported by the hash"
  awk 'toupper($1) == "COPY" { for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i }' "$1"
}

# sha256 over the Dockerfile, .dockerignore, every file its COPYs take (less what .dockerignore
# drops inside them: __pycache__, *.pyc) and the build settings that change the image's content.
content_hash() {
  local df=$1 srcs
  mapfile -t srcs < <(copy_sources "$df")
  for s in "${srcs[@]}"; do [ -e "$s" ] || die "$df copies $s, which does not exist"; done
  {
    printf 'base=%s torch-index=%s\n' "$BASE_REF" "${TORCH_INDEX:-default}"
    find "$df" .dockerignore "${srcs[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
      | LC_ALL=C sort -zu | xargs -0 sha256sum
  } | sha256sum | cut -c1-12
}

# Every pin of requirements/serving.lock that requirements/product.lock also pins must be equal.
check_serving_lock() {
  local bad
  bad=$(awk '
    function norm(s) { s = tolower(s); gsub(/[-_.]+/, "-", s); return s }
    { sub(/#.*/, ""); gsub(/[[:space:]]/, "") }
    !/==/ { next }
    { split($0, p, "=="); n = norm(p[1]) }
    FNR == NR { full[n] = p[2]; next }
    (n in full) && full[n] != p[2] { printf "%s==%s (requirements/product.lock: %s) ", p[1], p[2], full[n] }
  ' requirements/product.lock requirements/serving.lock)
  [ -z "$bad" ] || die "requirements/serving.lock differs from requirements/product.lock: $bad"
}

if [ -n "$PUSH" ]; then PREFIX=$PUSH; else PREFIX=localhost; fi

build_args=()
[ "$E" = podman ] && build_args+=(--layers)
if [ -n "$FIND_LINKS" ] || [ -n "$CA_BUNDLE" ]; then build_args+=(--network host); fi
[ -n "$FIND_LINKS" ] && build_args+=(-v "$FIND_LINKS:$WHEELS_TARGET:ro" --build-arg "PIP_FIND_LINKS=$WHEELS_TARGET")
[ -n "$CA_BUNDLE" ] && build_args+=(-v "$CA_BUNDLE:$CA_TARGET:ro" --build-arg "PIP_CERT=$CA_TARGET")
# A local wheel directory usually means no route to the PyTorch index: skip it unless asked for.
torch_index=$TORCH_INDEX
[ -z "$torch_index" ] && [ -n "$FIND_LINKS" ] && torch_index=none
if [ "$torch_index" = none ]; then build_args+=(--build-arg TORCH_INDEX_URL=)
elif [ -n "$torch_index" ]; then build_args+=(--build-arg "TORCH_INDEX_URL=$torch_index")
fi

declare -A R_REF R_TAGS R_ID R_DIGEST R_SIZE R_BUILT R_SECONDS
images=(serving serving-python pipeline)
[ -n "$ONLY" ] && images=("$ONLY")
[[ " ${images[*]} " == *" serving"* ]] && check_serving_lock

for img in "${images[@]}"; do
  df=$(dockerfile_of "$img")
  lock=$(lock_of "$img")
  grep -qF "$lock" "$df" || die "$df does not use $lock"
  name=$PREFIX/mnist-embedding-$img
  tag=h-$(content_hash "$df")
  ref=$name:$tag
  tags=("$tag"); [ -n "$EXTRA_TAG" ] && tags+=("$EXTRA_TAG")
  log=build/$img-build.log
  t0=$(date +%s%N)
  if $E image inspect "$ref" >/dev/null 2>&1; then
    built=false
    say "$img: $ref exists (cached)"
  elif [ -n "$PUSH" ] && $E image inspect "localhost/mnist-embedding-$img:$tag" >/dev/null 2>&1; then
    built=false
    $E tag "localhost/mnist-embedding-$img:$tag" "$ref"
    say "$img: $ref tagged from localhost/mnist-embedding-$img:$tag (cached)"
  else
    built=true
    say "$img: building $ref (log: $log)"
    target=$(target_of "$img")
    if ! $E build "${build_args[@]}" -f "$df" ${target:+--target "$target"} -t "$ref" \
           --label "org.opencontainers.image.version=$tag" . >"$log" 2>&1; then
      tail -n 25 "$log" >&2
      grep -q 'cgroups in hybrid mode' "$log" && echo "$PROG: hint: podman's crun fails here; add --runtime runc" >&2
      grep -qiE 'setrlimit|RLIMIT_NOFILE' "$log" && echo "$PROG: hint: add --runtime runc (writes lower ulimits)" >&2
      die "$img: build failed (full log: $log)"
    fi
  fi
  [ -n "$EXTRA_TAG" ] && $E tag "$ref" "$name:$EXTRA_TAG"
  digest=""
  if [ -n "$PUSH" ]; then
    for t in "${tags[@]}"; do
      say "$img: pushing $name:$t"
      if [ "$E" = podman ]; then
        $E push --digestfile "build/$img.digest" "$name:$t" >>"$log" 2>&1 \
          || { tail -n 10 "$log" >&2; die "$img: push of $name:$t failed (log: $log)"; }
        digest=$(cat "build/$img.digest")
      else
        $E push "$name:$t" >>"$log" 2>&1 || { tail -n 10 "$log" >&2; die "$img: push of $name:$t failed (log: $log)"; }
        digest=$($E image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' "$ref" \
                   | grep -F "$name@" | head -n1 | cut -d@ -f2 || true)
      fi
    done
  fi
  t1=$(date +%s%N)
  R_REF[$img]=$ref
  R_TAGS[$img]=${tags[*]}
  R_ID[$img]=$($E image inspect --format '{{.Id}}' "$ref")
  R_SIZE[$img]=$($E image inspect --format '{{.Size}}' "$ref")
  R_DIGEST[$img]=$digest
  R_BUILT[$img]=$built
  R_SECONDS[$img]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  printf '%-14s %s  %d MB  id %s  %s%s  %s s  %s\n' "$img" "$ref" $(( R_SIZE[$img] / 1000000 )) \
    "${R_ID[$img]:0:12}" "${EXTRA_TAG:+also :$EXTRA_TAG  }" "${digest:+digest $digest  }" \
    "${R_SECONDS[$img]}" "$([ "$built" = true ] && echo built || echo cached)"
done

# --- build/images.json (entries of images not built this time are kept) ------------------------------
export BI_ENGINE=$E BI_CONF=${CONTAINERS_CONF:-}
for img in "${images[@]}"; do
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$img" "${R_REF[$img]}" "${R_TAGS[$img]}" "${R_ID[$img]}" \
    "${R_DIGEST[$img]}" "${R_SIZE[$img]}" "${R_BUILT[$img]}" "${R_SECONDS[$img]}"
done | python3 -c '
import json, os, sys
path = "build/images.json"
try:
    with open(path) as f:
        old = json.load(f)
except (OSError, ValueError):
    old = {}
conf = os.environ["BI_CONF"]
keep = old.get("engine") == os.environ["BI_ENGINE"]
images = {k: v for k, v in old.items() if keep and k in ("serving", "serving-python", "pipeline")}
for line in sys.stdin:
    name, ref, tags, iid, digest, size, built, secs = line.rstrip("\n").split("\t")
    images[name] = {"ref": ref, "tags": tags.split(), "id": iid, "digest": digest or None,
                    "size_bytes": int(size), "built": built == "true", "seconds": float(secs)}
out = {"engine": os.environ["BI_ENGINE"], "containers_conf": os.path.abspath(conf) if conf else None,
       **dict(sorted(images.items()))}
tmp = path + ".tmp"
with open(tmp, "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
'
say "wrote build/images.json"
