"""Certificates for a Slurm job's Dask cluster: a certificate authority made for the job and one
certificate it signs, which the scheduler, the workers and the client all present (Dask's
mutual TLS). A process without them can neither submit tasks nor join as a worker.

``python -m tokenmill.infra.tls DIRECTORY`` writes ``ca.pem``, ``cert.pem`` and ``key.pem``
into DIRECTORY (mode 0700, the key 0600). The authority's own key is never written: once the
files exist, no other certificate can be made that the job's cluster accepts.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from pathlib import Path

CA_FILE = "ca.pem"
CERT_FILE = "cert.pem"
KEY_FILE = "key.pem"
# Longer than any Slurm job runs: a chain of jobs makes certificates of its own, one per job.
VALID_DAYS = 60


@dataclass(frozen=True)
class JobCertificates:
    ca_file: Path
    cert_file: Path
    key_file: Path


def write_job_certificates(directory: Path) -> JobCertificates:
    """A fresh authority and a certificate for client and server use, written into
    ``directory`` (replacing what an earlier run of the same job wrote there)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=VALID_DAYS)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("tokenmill job certificate authority")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("tokenmill dask"))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    files = JobCertificates(directory / CA_FILE, directory / CERT_FILE, directory / KEY_FILE)
    _write_private(files.ca_file, ca.public_bytes(serialization.Encoding.PEM))
    _write_private(files.cert_file, cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        files.key_file,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    return files


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by this user only, from the first byte (never world-readable,
    even for a moment)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


if __name__ == "__main__":
    write_job_certificates(Path(sys.argv[1]))
