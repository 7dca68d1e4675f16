#!/usr/bin/env bash
# Make SuperNode authentication key pairs (ECDSA P-384, OpenSSH format, no passphrase).
#
#   deploy/make_keys.sh OUT_DIR NUM_SUPERNODES
#
# Writes OUT_DIR/supernode_credentials_<i> (private key: stays on the host of the
# SuperNode with partition-id i, passed as --auth-supernode-private-key) and
# OUT_DIR/supernode_credentials_<i>.pub (registered on the SuperLink with
# `flwr supernode register`), for i = 0..N-1.
# Existing key pairs are kept.
set -euo pipefail

if [[ $# -ne 2 || "$1" == -h || "$1" == --help ]]; then
  echo "usage: $0 OUT_DIR NUM_SUPERNODES   (e.g. $0 keys 3)" >&2
  exit 2
fi
command -v ssh-keygen >/dev/null || { echo "ssh-keygen not found; install it (apt-get install openssh-client)" >&2; exit 1; }
out="$1"; n="$2"
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "NUM_SUPERNODES='$n' must be a whole number >= 1" >&2; exit 2; }
mkdir -p "$out"
for ((i = 0; i < n; i++)); do
  key="$out/supernode_credentials_$i"
  [[ -f "$key" && -f "$key.pub" ]] && continue
  rm -f "$key" "$key.pub"
  ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedhetero-supernode-$i" -f "$key"
done
echo "keys: $out/supernode_credentials_{0..$((n - 1))}[.pub]"
