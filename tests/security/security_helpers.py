"""Helpers only the security tests use: database fingerprints and a test PKI (a unique module
name: no clash with other parts' helpers; the shared ones are in tests/testkit.py)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import text
from sqlalchemy.engine import Engine

#: Tables the worker derives from stored rows (never written by a request directly): the
#: roll-ups and the rest of the analysis copy's bookkeeping (``analysis_*``: signatures,
#: watermarks), which a refresh still running after an earlier test's campaign moves.
DERIVED_TABLE_MARKERS = ("rollup", "analysis_", "path_estimates", "celery", "alembic_version")
#: Columns the worker's join fills in later (a still-running join of an earlier test must not
#: look like a change made by a request).
WORKER_FILLED_COLUMNS = frozenset(
    {
        "joined_at",
        "server_latency_us",
        "server_first_byte_us",
        "server_total_retrans",
        "server_bytes_retrans",
        "server_bytes_sent",
        "server_snd_cwnd_at_accept",
        "cwnd_mismatch",
        "rwnd_limited",
    }
)


def table_fingerprints(engine: Engine) -> dict[str, str]:
    """Row count and md5 of the sorted rows of every table the API writes (the session database is small)."""
    with engine.connect() as connection:
        tables = (
            connection.execute(
                text(
                    "SELECT quote_ident(c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition "
                    "ORDER BY 1"
                )
            )
            .scalars()
            .all()
        )
        fingerprints = {}
        for table in tables:
            if any(marker in table for marker in DERIVED_TABLE_MARKERS):
                continue
            columns = [
                name
                for name in connection.execute(
                    text(
                        "SELECT quote_ident(column_name) FROM information_schema.columns WHERE table_schema = 'public' "
                        "AND table_name = :t ORDER BY ordinal_position"
                    ),
                    {"t": table.strip('"')},
                ).scalars()
                if name not in WORKER_FILLED_COLUMNS
            ]
            row = connection.execute(
                text(
                    f"SELECT count(*), coalesce(md5(string_agg(ROW({', '.join(columns)})::text, '|' "
                    f"ORDER BY ROW({', '.join(columns)})::text)), '') FROM {table}"
                )
            ).one()
            fingerprints[table] = f"{row[0]}:{row[1]}"
    return fingerprints


# ----------------------------------------------------------------------------- test PKI
@dataclass
class Pki:
    """A CA made at test time and a server certificate it signed (files in ``directory``)."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    ca_key_file: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_pki(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), label: str = "ca") -> Pki:
    """A self-signed CA (``label``) and a leaf for ``hosts`` (IP addresses or DNS names)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"iwscope test {label}"))
        .issuer_name(_name(f"iwscope test {label}"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file, ca_key_file = directory / f"{label}.pem", directory / f"{label}.key"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    ca_key_file.write_bytes(
        ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    ca_key_file.chmod(0o600)
    return _sign(ca_file, ca_key_file, directory, hosts, label)


def sign_leaf(ca: Pki, directory: Path, host: str) -> Pki:
    """Another server certificate from the CA of ``ca``, for ``host``."""
    return _sign(ca.ca_file, ca.ca_key_file, directory, (host,), "leaf")


def _sign(ca_file: Path, ca_key_file: Path, directory: Path, hosts: tuple[str, ...], label: str) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_cert = x509.load_pem_x509_certificate(ca_file.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_file.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(ca_file, directory / f"{label}-server.pem", directory / f"{label}-server.key", ca_key_file)
    pki.cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    pki.key_file.write_bytes(
        leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pki.key_file.chmod(0o600)
    return pki
