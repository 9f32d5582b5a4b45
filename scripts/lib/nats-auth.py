#!/usr/bin/env python3
"""NATS test credentials for scripts/services/nats.sh, generated at start-up, never committed.

Usage: nats-auth.py DIR

Writes into DIR (created mode 700, files mode 600), unless DIR/done exists:
  token            a random token (nats-token's `authorization { token }`)
  user.nk          a user NKey seed (SU...), user.pub its public key (nats-tls's nkey user)
  operator.jwt     a self-signed operator JWT, account.pub and account.jwt an account with
                   JetStream (no limits) signed by the operator, system.pub and system.jwt the
                   system account (nats-jwt's `operator`, `resolver: MEMORY` preload)
  user.creds       a user of that account: its JWT and NKey seed, the `.creds` file format

NKeys (github.com/nats-io/nkeys): base32 without padding of a prefix byte (seeds: two bytes
carrying the seed prefix and the key type), the 32-byte Ed25519 key and a CRC-16/XMODEM of
them, little-endian. JWTs (github.com/nats-io/jwt v2): header {"typ":"JWT","alg":"ed25519-nkey"},
base64url without padding, signed with the issuer's Ed25519 key.
"""

import base64
import hashlib
import json
import os
import secrets
import sys
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

PREFIX_SEED = 18 << 3
PREFIX = {"operator": 14 << 3, "account": 0, "user": 20 << 3}


def crc16(data):
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
    return crc


def b32(raw):
    raw = bytes(raw)
    raw += crc16(raw).to_bytes(2, "little")
    return base64.b32encode(raw).decode().rstrip("=")


def b64url(raw):
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class NKey:
    def __init__(self, kind):
        self.kind = kind
        self.key = Ed25519PrivateKey.generate()
        raw_seed = self.key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        raw_pub = self.key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        prefix = PREFIX[kind]
        self.public = b32([prefix] + list(raw_pub))
        self.seed = b32([PREFIX_SEED | (prefix >> 5), (prefix & 31) << 3] + list(raw_seed))


def jwt(issuer, subject, name, nats):
    claims = {"iat": int(time.time()), "iss": issuer.public, "name": name, "sub": subject.public}
    claims["nats"] = dict(nats, version=2)
    digest = hashlib.sha512(json.dumps(claims, sort_keys=True).encode()).digest()[:32]
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = b64url(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = b64url(json.dumps(claims).encode())
    signature = issuer.key.sign(f"{header}.{body}".encode())
    return f"{header}.{body}.{b64url(signature)}"


UNLIMITED = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


def write(directory, name, text):
    path = os.path.join(directory, name)
    fd = os.open(path + ".new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(path + ".new", path)


def main():
    directory = sys.argv[1]
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if os.path.exists(os.path.join(directory, "done")):
        return
    write(directory, "token", secrets.token_hex(16) + "\n")

    nkey_user = NKey("user")
    write(directory, "user.nk", nkey_user.seed + "\n")
    write(directory, "user.pub", nkey_user.public + "\n")

    operator = NKey("operator")
    account = NKey("account")
    system = NKey("account")
    user = NKey("user")
    write(directory, "operator.jwt", jwt(operator, operator, "distlock", {"type": "operator"}))
    limits = dict(UNLIMITED, **JETSTREAM)
    write(directory, "account.pub", account.public + "\n")
    write(
        directory,
        "account.jwt",
        jwt(operator, account, "distlock", {"type": "account", "limits": limits}),
    )
    write(directory, "system.pub", system.public + "\n")
    write(
        directory,
        "system.jwt",
        jwt(operator, system, "SYS", {"type": "account", "limits": UNLIMITED}),
    )
    user_jwt = jwt(
        account,
        user,
        "distlock",
        {"type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1},
    )
    write(
        directory,
        "user.creds",
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user.seed}\n"
        "------END USER NKEY SEED------\n",
    )
    write(directory, "done", "")


if __name__ == "__main__":
    main()
