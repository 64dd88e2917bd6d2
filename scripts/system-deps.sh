#!/usr/bin/env bash
# System packages the test suite uses beyond Java 17: wrk (the benchmark's HTTP load generator) and
# podman, buildah, runc, mmdebstrap, uidmap (scripts/build-images.sh builds and runs the images without
# a Docker daemon or registry), prometheus with promtool (deploy/prometheus/, tests/integration/test_prometheus.py; installed
# through scripts/prometheus.sh, which keeps Debian's own prometheus service off port 9090). RabbitMQ is
# installed on demand by scripts/rabbitmq.sh. fonts-dejavu-core gives training its printed digits and non-digit
# glyphs; fonts-liberation and fonts-freefont-ttf render the printed digits the product-quality tests check;
# dataset-fashion-mnist is the open-set exam of the digit model and the second dataset (full-frame profile).
# chromium opens the HTML model report in the report test (a real headless browser).
# nginx with lua-nginx-module fronts TorchServe in the serving runtime (serving/kserve_runtime/nginx_front.py), on the
# host in tests and benchmarks as in the image; Debian's own nginx service is stopped again after the install.
# The uploads exam of the digit model (training/uploads.py, docs/non-digits.md) is made of the Adwaita and hicolor
# icon themes, Glyphicons Halflings, Font Awesome, Noto Color Emoji (about 10 MB) and the Liberation/FreeFont faces.
# kubectl (Debian's kubernetes-client, or any kubectl already on PATH) runs the alerts' runbook steps in
# tests/e2e/test_kserve_container.py against the stand-in API server (tests/support/kube_operator.py).
# g++ compiles the int8 model ahead of time (training/quantize.py; $CXX when set); serving needs no compiler.
# Installs only what is missing, as root.
set -euo pipefail
missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v "${CXX:-g++}" >/dev/null 2>&1 || missing+=(g++)  # the int8 model's AOTInductor build
command -v podman >/dev/null 2>&1 || missing+=(podman)
command -v buildah >/dev/null 2>&1 || missing+=(buildah)
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing+=(runc)
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v newuidmap >/dev/null 2>&1 || [ -x /usr/bin/newuidmap ] || missing+=(uidmap)
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)  # training's glyphs, digits
[ -d /usr/share/fonts/truetype/liberation ] || missing+=(fonts-liberation)  # the printed-digit exam
[ -d /usr/share/fonts/truetype/freefont ] || missing+=(fonts-freefont-ttf)
[ -d /usr/share/datasets/fashion-mnist ] || missing+=(dataset-fashion-mnist)  # the open-set exam, the second dataset
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)  # the runbooks' kubectl steps
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # renders the HTML report in its test
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)  # the serving runtime's front
[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] || missing+=(libnginx-mod-http-lua)
[ -d /usr/share/icons/Adwaita ] || missing+=(adwaita-icon-theme)  # the uploads exam
[ -f /usr/share/icons/hicolor/index.theme ] || missing+=(hicolor-icon-theme)
[ -f /usr/share/fonts/truetype/glyphicons/glyphicons-halflings-regular.ttf ] || missing+=(fonts-glyphicons-halflings)
[ -f /usr/share/fonts/truetype/font-awesome/fontawesome-webfont.ttf ] || missing+=(fonts-font-awesome)
[ -f /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf ] || missing+=(fonts-noto-color-emoji)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing ${missing[*]}; install with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
if [[ " ${missing[*]} " == *" prometheus "* ]]; then
  "$(dirname "$0")/prometheus.sh" install
  rest=()
  for pkg in "${missing[@]}"; do [ "$pkg" = prometheus ] || rest+=("$pkg"); done
  missing=("${rest[@]}")
  [ ${#missing[@]} -eq 0 ] && exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
  || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } \
  || { echo "system-deps: apt-get install ${missing[*]} failed" >&2; exit 1; }
if [[ " ${missing[*]} " == *" nginx "* ]]; then
  # Debian starts its own nginx service on port 80; the tests run their own nginx processes.
  { invoke-rc.d nginx stop || service nginx stop; } >/dev/null 2>&1 || true
fi
