//! Which backend the gateway stores history in, and opening it.
//!
//! Why it exists: the gateway converts `--history-backend` and its options
//! into one typed [`HistoryConfig`] once, and [`open`] turns that into the
//! trait object it keeps; no other part of the gateway names a backend type.

use std::{fmt, path::PathBuf, sync::Arc, time::Duration};

use crate::{
    HistoryResult, HistoryStore, memory::MemoryStore, none::NoneStore, postgres::PostgresStore,
    sqlite::SqliteStore,
};

/// The history backend and its settings.
#[derive(Clone, PartialEq, Eq)]
pub enum HistoryConfig {
    /// Keep nothing.
    None,
    /// Keep everything in process, lost on restart.
    Memory,
    /// An embedded database file (its parent directories are created).
    Sqlite { path: PathBuf },
    /// A PostgreSQL server shared by several gateway replicas.
    Postgres {
        url: String,
        max_connections: u32,
        /// How long a call waits for a connection (a free one of the pool,
        /// or a new one) before it fails `Unavailable`; also the bound on
        /// connecting at open.
        connect_timeout: Duration,
    },
}

impl HistoryConfig {
    /// The backend's name, as `--history-backend` spells it.
    pub fn backend(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Memory => "memory",
            Self::Sqlite { .. } => "sqlite",
            Self::Postgres { .. } => "postgres",
        }
    }
}

/// Written by hand so a logged config never shows the database password.
impl fmt::Debug for HistoryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("None"),
            Self::Memory => f.write_str("Memory"),
            Self::Sqlite { path } => f.debug_struct("Sqlite").field("path", path).finish(),
            Self::Postgres {
                url,
                max_connections,
                connect_timeout,
            } => f
                .debug_struct("Postgres")
                .field("url", &redact_url(url))
                .field("max_connections", max_connections)
                .field("connect_timeout", connect_timeout)
                .finish(),
        }
    }
}

/// The URL with its password (between `user:` and `@`) replaced by `***`.
pub(crate) fn redact_url(url: &str) -> String {
    match password_span(url) {
        Some((start, end)) if end > start => format!("{}***{}", &url[..start], &url[end..]),
        _ => url.to_owned(),
    }
}

/// `message` with every occurrence of `url`'s password replaced by `***`
/// (for error messages of a library that was handed the URL).
pub(crate) fn redact_secret(url: &str, message: &str) -> String {
    match password_span(url) {
        Some((start, end)) if end > start => message.replace(&url[start..end], "***"),
        _ => message.to_owned(),
    }
}

/// Where the password sits in the URL (byte offsets): in the authority
/// (before the first `/`, `?` or `#` after `scheme://`), after the user's
/// `:` and before the last `@`.
fn password_span(url: &str) -> Option<(usize, usize)> {
    let authority_start = url.find("://").map_or(0, |at| at + 3);
    let rest = &url[authority_start..];
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (userinfo, _host) = authority.rsplit_once('@')?;
    let colon = userinfo.find(':')?;
    Some((
        authority_start + colon + 1,
        authority_start + userinfo.len(),
    ))
}

/// Opens the configured backend (for SQL backends: connects and migrates).
pub async fn open(config: &HistoryConfig) -> HistoryResult<Arc<dyn HistoryStore>> {
    match config {
        HistoryConfig::None => Ok(Arc::new(NoneStore)),
        HistoryConfig::Memory => Ok(Arc::new(MemoryStore::new())),
        HistoryConfig::Sqlite { path } => Ok(Arc::new(SqliteStore::open(path).await?)),
        HistoryConfig::Postgres {
            url,
            max_connections,
            connect_timeout,
        } => Ok(Arc::new(
            PostgresStore::connect(url, *max_connections, *connect_timeout).await?,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_hides_the_password() {
        let config = HistoryConfig::Postgres {
            url: "postgres://smg:s3cret@db:5432/smg".into(),
            max_connections: 8,
            connect_timeout: Duration::from_secs(5),
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("postgres://smg:***@db:5432/smg"), "{shown}");
        assert_eq!(redact_url("postgres://p:p@h/p"), "postgres://p:***@h/p");
        assert_eq!(
            redact_secret(
                "postgres://u:s3cret@h/db",
                "bad url postgres://u:s3cret@h/db"
            ),
            "bad url postgres://u:***@h/db"
        );
    }

    #[test]
    fn the_password_is_found_only_in_the_userinfo() {
        let cases = [
            ("postgres://u:p@h/db", Some("p")),
            ("postgres://u:p:q@h/db", Some("p:q")),
            ("postgres://u@h/db", None),
            ("postgres://h/db", None),
            ("postgres://u:p%40x@h/db", Some("p%40x")),
            ("postgres://h/db?options=a:b@c", None),
            ("postgres://pa:p@h/db", Some("p")),
        ];
        for (url, password) in cases {
            let found = password_span(url).map(|(start, end)| &url[start..end]);
            assert_eq!(found, password, "{url}");
        }
    }
}
