//! TLS for PostgreSQL connections: libpq's `sslmode` values over rustls (ring).
//!
//! | `sslmode` | TLS | server certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default) | when the server offers it, else plain TCP | not checked |
//! | `require` | always | not checked (checked as `verify-ca` when `sslrootcert` is given) |
//! | `verify-ca` | always | chain to a trusted root |
//! | `verify-full` | always | chain to a trusted root and the host name |
//!
//! The trusted roots are the PEM file named by `sslrootcert`, or the Mozilla roots (webpki-roots)
//! when it is absent or `system`.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use toolledger_core::store::StoreError;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// What tokio-postgres negotiates (it knows disable, prefer and require).
    pub(super) fn negotiation(self) -> PgSslMode {
        match self {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
        }
    }
}

/// A URL with `sslmode` and `sslrootcert` taken out of its query.
#[derive(Debug)]
pub(super) struct TlsUrl {
    pub(super) url: String,
    pub(super) mode: SslMode,
    pub(super) root_cert: Option<String>,
}

fn percent_decode(value: &str) -> Result<String, StoreError> {
    let bad = || StoreError::UrlInvalid("it is malformed".into());
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3).ok_or_else(bad)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// Takes `sslmode` and `sslrootcert` out of `url`'s query (tokio-postgres parses neither
/// `verify-ca`/`verify-full` nor `sslrootcert`).
pub(super) fn split_url(url: &str) -> Result<TlsUrl, StoreError> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut mode = SslMode::Prefer;
    let mut root_cert = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => {
                mode =
                    match percent_decode(value)?.as_str() {
                        "disable" => SslMode::Disable,
                        "prefer" => SslMode::Prefer,
                        "require" => SslMode::Require,
                        "verify-ca" => SslMode::VerifyCa,
                        "verify-full" => SslMode::VerifyFull,
                        _ => return Err(StoreError::UrlInvalid(
                            "sslmode must be disable, prefer, require, verify-ca or verify-full"
                                .into(),
                        )),
                    }
            }
            "sslrootcert" => root_cert = Some(percent_decode(value)?),
            _ => kept.push(pair),
        }
    }
    // libpq: with a root certificate, `require` checks the chain like `verify-ca`.
    if mode == SslMode::Require && root_cert.is_some() {
        mode = SslMode::VerifyCa;
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(TlsUrl {
        url,
        mode,
        root_cert,
    })
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(root_cert: Option<&str>) -> Result<RootCertStore, StoreError> {
    match root_cert {
        None | Some("system") => Ok(RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        }),
        Some(path) => {
            let unreadable =
                || StoreError::UrlInvalid("the sslrootcert file cannot be read".into());
            let mut store = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path).map_err(|_| unreadable())? {
                store
                    .add(cert.map_err(|_| unreadable())?)
                    .map_err(|_| unreadable())?;
            }
            if store.is_empty() {
                return Err(unreadable());
            }
            Ok(store)
        }
    }
}

/// The TLS connector for `mode`; `None` for `disable`.
pub(super) fn connector(
    mode: SslMode,
    root_cert: Option<&str>,
) -> Result<Option<MakeRustlsConnect>, StoreError> {
    let provider = provider();
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer | SslMode::Require => Arc::new(Unchecked(provider.clone())),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let webpki = WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(root_cert)?),
                provider.clone(),
            )
            .build()
            .map_err(|_| StoreError::Database("the TLS root certificates are unusable".into()))?;
            Arc::new(Checked {
                webpki,
                check_name: mode == SslMode::VerifyFull,
            })
        }
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| StoreError::Database("TLS is unavailable".into()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// `prefer`/`require`: the connection is encrypted, the server is not authenticated (libpq's
/// meaning of these modes). The handshake signature is still checked against the presented
/// certificate.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
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
        verify_tls12_signature(
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
        verify_tls13_signature(
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

/// `verify-ca` (chain only) and `verify-full` (chain and host name).
#[derive(Debug)]
struct Checked {
    webpki: Arc<WebPkiServerVerifier>,
    check_name: bool,
}

impl ServerCertVerifier for Checked {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_leave_the_url() {
        let t = split_url("postgres://u@h/db?sslmode=verify-full&application_name=x").unwrap();
        assert_eq!(t.url, "postgres://u@h/db?application_name=x");
        assert_eq!(t.mode, SslMode::VerifyFull);
        assert_eq!(t.root_cert, None);
        let t = split_url("postgres://u@h/db?sslrootcert=%2Ftmp%2Fca.pem&sslmode=require").unwrap();
        assert_eq!(t.url, "postgres://u@h/db");
        assert_eq!(t.mode, SslMode::VerifyCa, "require with a root certificate");
        assert_eq!(t.root_cert.as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(
            split_url("postgres://u@h/db").unwrap().mode,
            SslMode::Prefer
        );
        assert_eq!(
            split_url("postgres://u@h/db?sslmode=disable").unwrap().mode,
            SslMode::Disable
        );
        assert!(split_url("postgres://u@h/db?sslmode=allow").is_err());
    }

    #[test]
    fn an_unreadable_root_certificate_is_refused_without_its_path() {
        let Err(err) = connector(SslMode::VerifyFull, Some("/nonexistent/secret-ca.pem")) else {
            panic!("a missing root certificate file is refused");
        };
        assert!(!err.to_string().contains("secret-ca"), "{err}");
        assert!(connector(SslMode::Disable, None).unwrap().is_none());
        assert!(connector(SslMode::VerifyFull, None).unwrap().is_some());
        assert!(connector(SslMode::Require, None).unwrap().is_some());
    }
}
