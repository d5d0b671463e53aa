//! Which store the node uses (`--store`), and the one interface the layers above the store apply turns through.
//!
//! SQLite (files under the state directory, [`super::AppStore`]) is the embedded default and needs no flag;
//! PostgreSQL is for several nodes that serve one fleet together (docs/scale-out.md).

use thiserror::Error;

/// `--store`: where records and heard sequences are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// One SQLite file per app under the state directory (docs/store.md).
    Sqlite,
    /// A PostgreSQL database shared by the nodes of a fleet: the URL as given (without a password).
    Postgres(String),
}

#[derive(Debug, Error)]
pub enum StoreChoiceError {
    #[error(
        "--store {given:?} holds a password, which would be visible in `ps` and in logs: remove it from the URL \
         and put it on the first line of a file named by --store-password-file (mode 0600)"
    )]
    PasswordInUrl { given: String },
    #[error(
        "--store {given:?}: this build stores in SQLite only, the PostgreSQL store of a fleet is not wired into \
         the node yet (docs/scale-out.md, \"What is built so far\"); leave --store out to store in SQLite"
    )]
    NotBuilt { given: String },
}

impl StoreChoice {
    /// Parses `--store`: `sqlite`, or a `postgres://` / `postgresql://` URL without a password.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "sqlite" {
            return Ok(StoreChoice::Sqlite);
        }
        let Some(rest) = s
            .strip_prefix("postgres://")
            .or_else(|| s.strip_prefix("postgresql://"))
        else {
            return Err(format!(
                "{s:?} is not a store: give `sqlite` (the default: files under --state) or a PostgreSQL URL such as \
                 postgres://pure@db.internal:5432/fleet (docs/scale-out.md)"
            ));
        };
        // The user info ends at the last '@' before the first '/' (the host part may hold none).
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@')
            && userinfo.contains(':')
        {
            return Err(StoreChoiceError::PasswordInUrl { given: redact(s) }.to_string());
        }
        Ok(StoreChoice::Postgres(s.to_string()))
    }

    /// Whether the node can serve from this store: PostgreSQL is refused until the host applies its turns through
    /// the engine (docs/scale-out.md).
    pub fn check_served(&self) -> Result<(), StoreChoiceError> {
        match self {
            StoreChoice::Sqlite => Ok(()),
            StoreChoice::Postgres(url) => Err(StoreChoiceError::NotBuilt { given: url.clone() }),
        }
    }
}

/// The URL with the password of its user info replaced by `***`, so an error never repeats it.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_choice_parses_sqlite_and_urls_and_refuses_passwords() {
        assert_eq!(StoreChoice::parse("sqlite"), Ok(StoreChoice::Sqlite));
        assert_eq!(
            StoreChoice::parse("postgres://pure@db:5432/fleet"),
            Ok(StoreChoice::Postgres(
                "postgres://pure@db:5432/fleet".into()
            ))
        );
        assert!(StoreChoice::parse("postgresql://pure@db/fleet?host=/run/postgresql").is_ok());
        let e = StoreChoice::parse("postgres://pure:hunter2@db/fleet").unwrap_err();
        assert!(e.contains("--store-password-file"), "{e}");
        assert!(!e.contains("hunter2"), "the password is not repeated: {e}");
        assert!(e.contains("pure:***@db/fleet"), "{e}");
        let e = StoreChoice::parse("mysql://x").unwrap_err();
        assert!(e.contains("sqlite"), "{e}");
        assert!(StoreChoice::Sqlite.check_served().is_ok());
        let e = StoreChoice::Postgres("postgres://pure@db/fleet".into())
            .check_served()
            .unwrap_err()
            .to_string();
        assert!(e.contains("not wired into the node yet"), "{e}");
    }
}
