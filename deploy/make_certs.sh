#!/usr/bin/env bash
# Make a private CA and a SuperLink server certificate signed by it (openssl).
#
#   deploy/make_certs.sh OUT_DIR [HOST_OR_IP ...]
#
# Writes OUT_DIR/ca.crt, ca.key, server.pem, server.key. The certificate's SANs are
# 127.0.0.1 and localhost (the SuperLink's own SuperExec connects over loopback, so
# they are always needed) plus every HOST_OR_IP given: the name or address the
# SuperNodes and the `flwr` CLI use to reach the SuperLink.
# Copy ca.crt (only) to every SuperNode host and CLI machine; server.key stays on the
# SuperLink host. Existing files are overwritten.
set -euo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  echo "usage: $0 OUT_DIR [HOST_OR_IP ...]   (e.g. $0 certificates superlink.example.org 10.0.0.5)" >&2
  exit 2
fi
command -v openssl >/dev/null || { echo "openssl not found; install it (apt-get install openssl)" >&2; exit 1; }

out="$1"; shift

dns=(localhost); ips=(127.0.0.1)
for host in "$@"; do
  if [[ "$host" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || "$host" == *:* ]]; then
    [[ " ${ips[*]} " == *" $host "* ]] || ips+=("$host")
  elif [[ "$host" =~ ^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]]; then
    [[ " ${dns[*]} " == *" $host "* ]] || dns+=("$host")
  else
    echo "bad host name or IP '$host': use a DNS name (letters, digits, '.', '-') or an IPv4/IPv6 address" >&2
    exit 2
  fi
done

mkdir -p "$out"
san=""
for i in "${!dns[@]}"; do san+="DNS.$((i + 1)) = ${dns[$i]}"$'\n'; done
for i in "${!ips[@]}"; do san+="IP.$((i + 1)) = ${ips[$i]}"$'\n'; done

conf="$out/certificate.conf"
cat > "$conf" <<CONF
[req]
default_bits = 4096
prompt = no
distinguished_name = dn
req_extensions = v3_req
[dn]
CN = ${dns[-1]}
O = fedhetero
[v3_req]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt_names
[v3_server]
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = @alt_names
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
[alt_names]
$san
CONF

openssl genrsa -out "$out/ca.key" 4096 2>/dev/null
openssl req -new -x509 -key "$out/ca.key" -sha256 -days 365 \
  -subj "/O=fedhetero/CN=fedhetero-ca" -out "$out/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -addext "subjectKeyIdentifier=hash"
openssl genrsa -out "$out/server.key" 4096 2>/dev/null
openssl req -new -key "$out/server.key" -out "$out/server.csr" -config "$conf"
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -out "$out/server.pem" -days 365 -sha256 -extfile "$conf" -extensions v3_server 2>/dev/null
rm -f "$out/server.csr" "$out/ca.srl"
chmod 600 "$out/ca.key" "$out/server.key"
echo "CA: $out/ca.crt  server: $out/server.pem, $out/server.key  SANs: ${dns[*]} ${ips[*]}"
