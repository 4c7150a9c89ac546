//! TLS material: the PEM files given to the client builder, turned into redis-rs
//! certificates (crate feature `tls`; without it, a TLS URL or file is refused).

use redis::{ConnectionInfo, RedisResult};

use crate::error::Error;

/// PEM contents of the TLS files given to the client builder.
#[derive(Clone, Default)]
pub(crate) struct TlsPems {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) cert: Option<Vec<u8>>,
    pub(crate) key: Option<Vec<u8>>,
}

impl TlsPems {
    pub(super) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }
}

#[cfg(feature = "tls")]
pub(super) type Certs = redis::TlsCertificates;
// without TLS there are never certificates (an uninhabited type keeps the code paths alike)
#[cfg(not(feature = "tls"))]
pub(super) type Certs = std::convert::Infallible;

/// A `redis::Client` for `info`, with the custom CA and client certificate if any.
pub(super) fn client_for(
    info: ConnectionInfo,
    certs: &Option<Certs>,
) -> RedisResult<redis::Client> {
    match certs {
        #[cfg(feature = "tls")]
        Some(c) => redis::Client::build_with_tls(info, c.clone()),
        #[cfg(not(feature = "tls"))]
        Some(c) => match *c {},
        None => redis::Client::open(info),
    }
}

/// The certificates of `pems` (none when no file was given).
#[cfg(feature = "tls")]
pub(super) fn certs(pems: TlsPems) -> Result<Option<Certs>, Error> {
    if pems.is_empty() {
        return Ok(None);
    }
    Ok(Some(redis::TlsCertificates {
        client_tls: match (pems.cert, pems.key) {
            (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
            _ => None,
        },
        root_cert: pems.ca,
    }))
}

/// Without the `tls` feature: no certificates, and an error if files were given.
#[cfg(not(feature = "tls"))]
pub(super) fn certs(pems: TlsPems) -> Result<Option<Certs>, Error> {
    if pems.is_empty() {
        Ok(None)
    } else {
        Err(Error::InvalidArgument(
            "TLS files were given, but redsem was built without its `tls` feature".into(),
        ))
    }
}
