//! The validated form of the apps file (`--apps FILE`, docs/apps.md); the parser lands with the flag.

use std::path::PathBuf;

use crate::proto::crypto::PublicKeyBytes;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppsConfig {
    pub apps: Vec<AppConfig>,
    pub path: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppConfig {
    pub name: String,
    pub accept: Accept,
    pub turn_records: u64,
    pub outlets: Vec<OutletConfig>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accept {
    All,
    Only(Vec<String>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutletConfig {
    pub name: String,
    pub kind: OutletKind,
    pub memory_bytes: usize,
    pub max_lag_records: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    pub path_and_query: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutletKind {
    Link {
        to: String,
        node_key: PublicKeyBytes,
        app: String,
    },
    Wire {
        url: HttpUrl,
        node_key: PublicKeyBytes,
        app: String,
        ca_file: Option<PathBuf>,
    },
    Webhook {
        url: HttpUrl,
        ca_file: Option<PathBuf>,
        headers: Vec<(String, String)>,
        batch_records: usize,
    },
    App {
        app: String,
    },
}

impl AppsConfig {
    pub fn default_single() -> Self {
        AppsConfig {
            apps: vec![AppConfig {
                name: "main".into(),
                accept: Accept::All,
                turn_records: 16_384,
                outlets: Vec::new(),
            }],
            path: None,
        }
    }
}
