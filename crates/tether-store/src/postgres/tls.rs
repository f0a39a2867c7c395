//! TLS to PostgreSQL: the `sslmode` and `sslrootcert` of a store URL, read
//! by Tether (tokio-postgres knows neither `verify-ca`, `verify-full` nor
//! `sslrootcert`), and the rustls client they make (the ring provider only:
//! no aws-lc-sys, no OpenSSL).
//!
//! | `sslmode` | what Tether does |
//! |---|---|
//! | absent, `disable` | no TLS |
//! | `allow` | refused: it would fall back to clear text unasked |
//! | `prefer`, `require` | TLS or no connection; the certificate is not checked, unless `sslrootcert` is given (then as `verify-ca`, as libpq does) |
//! | `verify-ca` | TLS; the certificate must chain to `sslrootcert` |
//! | `verify-full` | TLS; the certificate must chain to `sslrootcert` and name the host |
//!
//! `prefer` is `require` here (a deliberate difference from libpq): a store
//! that asks for TLS never silently runs in clear. Without `sslrootcert`,
//! `verify-ca` and `verify-full` read `~/.postgresql/root.crt`, as libpq
//! does, and refuse when it is missing.
//!
//! Never here: the connection itself (`conn`).

use crate::StoreError;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// What a store URL asks of TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    Disable,
    /// Encrypted; the server's certificate unchecked.
    Require,
    /// Encrypted; the certificate chains to the root file.
    VerifyCa,
    /// Encrypted; the certificate chains to the root file and names the host.
    VerifyFull,
}

/// A URL's TLS request, taken out of it, and the URL without it (which
/// tokio-postgres then parses).
pub(crate) struct TlsRequest {
    pub(crate) mode: TlsMode,
    pub(crate) root: Option<PathBuf>,
    pub(crate) rest: String,
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Takes `sslmode`, `sslrootcert` (and refuses client certificates, which
/// are not supported) out of the URL's query.
pub(crate) fn take_tls_params(url: &str) -> Result<TlsRequest, StoreError> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut mode = None;
    let mut root = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match percent_decode(key).as_str() {
            "sslmode" => mode = Some(percent_decode(value)),
            "sslrootcert" => root = Some(PathBuf::from(percent_decode(value))),
            k @ ("sslcert" | "sslkey" | "sslpassword" | "sslcrl" | "sslcrldir") => {
                return Err(StoreError::Invalid(format!(
                    "the store URL's {k} is not supported: Tether authenticates to PostgreSQL by password (PGPASSWORD or a passfile), over TLS with sslmode=verify-full"
                )))
            }
            _ => kept.push(pair),
        }
    }
    let mode = match mode.as_deref() {
        None | Some("disable") => TlsMode::Disable,
        Some("prefer" | "require") if root.is_some() => TlsMode::VerifyCa,
        Some("prefer" | "require") => TlsMode::Require,
        Some("verify-ca") => TlsMode::VerifyCa,
        Some("verify-full") => TlsMode::VerifyFull,
        Some("allow") => {
            return Err(StoreError::Invalid(
                "sslmode=allow is refused: it runs in clear text whenever the server allows; use sslmode=verify-full (or require, or disable)".into(),
            ))
        }
        Some(other) => {
            return Err(StoreError::Invalid(format!(
                "unknown sslmode {other:?} in the store URL (disable, prefer, require, verify-ca, verify-full)"
            )))
        }
    };
    if mode == TlsMode::Disable && root.is_some() {
        return Err(StoreError::Invalid(
            "the store URL names an sslrootcert but no sslmode: add sslmode=verify-full".into(),
        ));
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(TlsRequest { mode, root, rest })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The root certificates of `path` (PEM, one or more).
fn load_roots(path: &Path) -> Result<rustls::RootCertStore, StoreError> {
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| StoreError::Invalid(format!("cannot read sslrootcert {shown}: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Invalid(format!("sslrootcert {shown} is not PEM: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(StoreError::Invalid(format!(
            "sslrootcert {shown} holds no usable certificate"
        )));
    }
    Ok(roots)
}

/// The root file: the URL's, else libpq's default `~/.postgresql/root.crt`.
fn root_path(root: Option<PathBuf>, mode: TlsMode) -> Result<PathBuf, StoreError> {
    if let Some(p) = root {
        return Ok(p);
    }
    let default = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".postgresql").join("root.crt"))
        .filter(|p| p.is_file());
    default.ok_or_else(|| {
        StoreError::Invalid(format!(
            "sslmode={} needs the CA certificate that signed the server's: name it with sslrootcert=FILE in the store URL (or put it in ~/.postgresql/root.crt)",
            if mode == TlsMode::VerifyFull { "verify-full" } else { "verify-ca" }
        ))
    })
}

/// The TLS connector a URL's request makes; `None` for no TLS.
pub(crate) fn connector(
    mode: TlsMode,
    root: Option<PathBuf>,
) -> Result<Option<MakeRustlsConnect>, StoreError> {
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        TlsMode::Disable => return Ok(None),
        TlsMode::Require => Arc::new(Unchecked(provider())),
        TlsMode::VerifyCa | TlsMode::VerifyFull => {
            let roots = load_roots(&root_path(root, mode)?)?;
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| StoreError::Invalid(format!("unusable sslrootcert: {e}")))?;
            if mode == TlsMode::VerifyFull {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            }
        }
    };
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Invalid(format!("TLS setup: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// `sslmode=require`: encrypted, the certificate not checked (libpq's
/// meaning); the handshake's signatures are still verified, so the session
/// is with whoever holds the certificate's key.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain is checked, the name is not. The webpki
/// verifier checks the chain before the name, so a name error means the
/// chain was good.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// What a failed TLS connection adds to its error, so that the operator
/// knows which check refused.
pub(crate) fn hint(mode: TlsMode, root: Option<&Path>, host: &str) -> String {
    let root = root.map_or_else(
        || "~/.postgresql/root.crt".to_owned(),
        |p| p.display().to_string(),
    );
    match mode {
        TlsMode::Disable => String::new(),
        TlsMode::Require => " (sslmode=require: the server must accept TLS)".into(),
        TlsMode::VerifyCa => format!(
            " (sslmode=verify-ca: the server's certificate must chain to {root})"
        ),
        TlsMode::VerifyFull => format!(
            " (sslmode=verify-full: the server's certificate must chain to {root} and name the host {host:?})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_the_url() {
        let r = take_tls_params(
            "postgres://u@db:5432/x?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=a",
        )
        .unwrap();
        assert_eq!(r.mode, TlsMode::VerifyFull);
        assert_eq!(r.root.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(r.rest, "postgres://u@db:5432/x?application_name=a");
        let r = take_tls_params("postgres://u@db/x").unwrap();
        assert_eq!(
            (r.mode, r.rest.as_str()),
            (TlsMode::Disable, "postgres://u@db/x")
        );
        let r = take_tls_params("postgres://u@db/x?sslmode=prefer").unwrap();
        assert_eq!(r.mode, TlsMode::Require);
        let r = take_tls_params("postgres://u@db/x?sslmode=require&sslrootcert=/ca").unwrap();
        assert_eq!(r.mode, TlsMode::VerifyCa);
        for bad in [
            "postgres://u@db/x?sslmode=allow",
            "postgres://u@db/x?sslmode=bogus",
            "postgres://u@db/x?sslmode=require&sslcert=/c",
            "postgres://u@db/x?sslrootcert=/ca",
        ] {
            assert!(
                matches!(take_tls_params(bad), Err(StoreError::Invalid(_))),
                "{bad}"
            );
        }
    }
}
