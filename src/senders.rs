//! The senders file: `NAME PUBLIC_KEY_BASE64` per line, `#` comments and blank lines (BRIEF.md, the interface).
//!
//! Parsing collects every problem rather than stopping at the first, so one run of the node (or of `check`) shows
//! the user all that is wrong with the file, each with its line number and a fix.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::keys::decode_key;
use crate::proto::allow_list::AllowList;
use crate::proto::crypto::PublicKeyBytes;

/// Longest sender name; names are stored as the `source` of every record.
pub const MAX_NAME_LEN: usize = 64;

/// Problems beyond this many are summarised, so a wholly wrong file does not flood the terminal.
const MAX_REPORTED: usize = 20;

#[derive(Debug)]
pub struct LineProblem {
    pub line: usize,
    pub what: String,
}

#[derive(Debug, Error)]
pub enum SendersError {
    #[error("cannot read senders file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", BadLines(path, problems, *more))]
    Bad {
        path: PathBuf,
        problems: Vec<LineProblem>,
        more: usize,
    },
}

struct BadLines<'a>(&'a Path, &'a [LineProblem], usize);

impl fmt::Display for BadLines<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.1.len() + self.2;
        write!(
            f,
            "senders file {} has {n} bad line{}",
            self.0.display(),
            if n == 1 { "" } else { "s" }
        )?;
        for p in self.1 {
            write!(f, "\n  {}:{}: {}", self.0.display(), p.line, p.what)?;
        }
        if self.2 > 0 {
            write!(f, "\n  … and {} more", self.2)?;
        }
        write!(
            f,
            "\n  each line is `NAME PUBLIC_KEY_BASE64` (make a key pair with `pure-serve keygen --out FILE`)"
        )
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:@-".contains(&b))
}

/// Reads and checks a senders file.
pub fn load(path: &Path) -> Result<AllowList, SendersError> {
    let text = std::fs::read(path).map_err(|source| SendersError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

/// Parses the text of a senders file; `path` is only used in messages.
pub fn parse(path: &Path, text: &[u8]) -> Result<AllowList, SendersError> {
    let mut problems: Vec<LineProblem> = Vec::new();
    let mut entries: Vec<(String, PublicKeyBytes)> = Vec::new();
    let mut lines_of: Vec<usize> = Vec::new();
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = i + 1;
        let Ok(raw) = std::str::from_utf8(raw) else {
            problems.push(LineProblem {
                line,
                what: "is not UTF-8 text".into(),
            });
            continue;
        };
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let fields: Vec<&str> = content.split_whitespace().collect();
        if fields.len() != 2 {
            problems.push(LineProblem {
                line,
                what: format!(
                    "has {} field{}, expected 2: a name and a base64 public key",
                    fields.len(),
                    if fields.len() == 1 { "" } else { "s" }
                ),
            });
            continue;
        }
        let (name, key) = (fields[0], fields[1]);
        if !valid_name(name) {
            problems.push(LineProblem {
                line,
                what: format!(
                    "name {name:?} is not 1–{MAX_NAME_LEN} characters of letters, digits and . _ : @ -"
                ),
            });
            continue;
        }
        match decode_key(key) {
            Ok(key) => {
                entries.push((name.to_string(), key));
                lines_of.push(line);
            }
            Err(e) => problems.push(LineProblem {
                line,
                what: format!("public key of {name}: {e}"),
            }),
        }
    }
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(entries.len());
    let mut by_key: HashMap<&PublicKeyBytes, usize> = HashMap::with_capacity(entries.len());
    for (idx, (name, key)) in entries.iter().enumerate() {
        if let Some(&first) = by_name.get(name.as_str()) {
            problems.push(LineProblem {
                line: lines_of[idx],
                what: format!(
                    "duplicate name {name}: line {} already has it; each sender needs its own name",
                    lines_of[first]
                ),
            });
        } else {
            by_name.insert(name, idx);
        }
        if let Some(&first) = by_key.get(key) {
            problems.push(LineProblem {
                line: lines_of[idx],
                what: format!(
                    "duplicate key: line {} ({}) has the same public key; each sender needs its own key pair",
                    lines_of[first], entries[first].0
                ),
            });
        } else {
            by_key.insert(key, idx);
        }
    }
    drop((by_name, by_key));
    if !problems.is_empty() {
        problems.sort_by_key(|p| p.line);
        let more = problems.len().saturating_sub(MAX_REPORTED);
        problems.truncate(MAX_REPORTED);
        return Err(SendersError::Bad {
            path: path.to_path_buf(),
            problems,
            more,
        });
    }
    Ok(AllowList::from_unique(entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::encode_key;

    fn k(b: u8) -> String {
        encode_key(&[b; 32])
    }

    #[test]
    fn good_file_with_comments_loads() {
        let text = format!("# devices\n\nalpha {}  # kitchen\nbeta\t{}\n", k(1), k(2));
        let list = parse(Path::new("s.txt"), text.as_bytes()).unwrap();
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn every_bad_line_is_named() {
        let text = format!(
            "alpha {}\nbeta\ngamma notbase64!\ndelta {}\nalpha {}\nepsilon {}\n",
            k(1),
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [3u8; 16]),
            k(4),
            k(1)
        );
        let err = parse(Path::new("s.txt"), text.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("s.txt:2: has 1 field"), "{err}");
        assert!(err.contains("s.txt:3: public key of gamma"), "{err}");
        assert!(err.contains("s.txt:4: public key of delta"), "{err}");
        assert!(
            err.contains("s.txt:5: duplicate name alpha: line 1"),
            "{err}"
        );
        assert!(
            err.contains("s.txt:6: duplicate key: line 1 (alpha)"),
            "{err}"
        );
        assert!(err.contains("5 bad lines"), "{err}");
    }
}
