#!/bin/sh
# Applies the optional build inputs of deploy/docker/inputs/ inside a build stage (root):
# every ca/*.crt joins the system trust bundle, which pip then uses (PIP_CERT), and is
# also gathered in extra-ca.pem for Node (NODE_EXTRA_CA_CERTS); wheels/ is a pip
# find-links folder (PIP_FIND_LINKS). With neither present it changes nothing.
set -eu
here=$(dirname "$0")
bundle=/etc/ssl/certs/ca-certificates.crt
: > "$here/extra-ca.pem"
for crt in "$here"/ca/*.crt; do
  [ -f "$crt" ] || continue
  cat "$crt" >> "$here/extra-ca.pem"
done
if [ -s "$here/extra-ca.pem" ]; then
  mkdir -p "$(dirname "$bundle")"
  cat "$here/extra-ca.pem" >> "$bundle"
  echo "build inputs: $(grep -c 'BEGIN CERTIFICATE' "$here/extra-ca.pem") extra CA certificate(s)"
fi
mkdir -p "$here/wheels"
n=$(find "$here/wheels" -name '*.whl' | wc -l)
[ "$n" -eq 0 ] || echo "build inputs: $n local wheel(s)"
