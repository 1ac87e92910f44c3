//! The AWS shared credentials file (`~/.aws/credentials`, or `AWS_SHARED_CREDENTIALS_FILE`):
//! the static keys of one profile, as `aws configure` writes them.
//!
//! Only the keys themselves are read. Profiles that obtain credentials some other way (SSO,
//! `role_arn` with a source profile, `credential_process`, all in `~/.aws/config`) need the
//! SDK's own machinery; for them the chain goes on to its next source, and `legate check`
//! says why a named profile was not used.

use std::path::Path;

use crate::config::Secret;

/// A credentials file is a few hundred bytes per profile; one larger than this is not one.
pub const FILE_LIMIT: u64 = 1 << 20;

/// One profile's keys (secrets: their `Debug` shows none).
#[derive(Debug, PartialEq, Eq)]
pub struct ProfileKeys {
    pub access_key_id: Secret,
    pub secret_access_key: Secret,
    pub session_token: Option<Secret>,
}

/// What the file holds for a profile.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    Keys(ProfileKeys),
    /// One of the two keys only.
    Partial,
    /// The profile is there without keys.
    NoKeys,
    /// No `[name]` section; `config_style`: there is a `[profile name]` one, the form of
    /// `~/.aws/config`, which the credentials file does not use.
    NoProfile {
        config_style: bool,
    },
}

/// The keys of `profile` in the text of a credentials file: `[name]` sections of
/// `key = value` lines, `#` and `;` comment lines. Names are compared as the SDKs do: the
/// section name exactly (whitespace trimmed), the keys without regard to case. A profile named
/// twice is read as one (the later lines win).
pub fn find(text: &str, profile: &str) -> Found {
    let mut in_profile = false;
    let (mut seen, mut config_style) = (false, false);
    let (mut id, mut secret, mut token) = (None, None, None);
    // A file saved with a byte-order mark (older Windows editors) starts with one.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.split(']').next().unwrap_or("").trim();
            in_profile = name == profile;
            seen |= in_profile;
            config_style |= name
                .strip_prefix("profile ")
                .is_some_and(|n| n.trim() == profile);
            continue;
        }
        if !in_profile {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim();
        let slot = match key.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => &mut id,
            "aws_secret_access_key" => &mut secret,
            // The older name some tools still write.
            "aws_session_token" | "aws_security_token" => &mut token,
            _ => continue,
        };
        *slot = (!value.is_empty()).then(|| value.to_owned());
    }
    match (id, secret) {
        (Some(id), Some(secret)) => Found::Keys(ProfileKeys {
            access_key_id: Secret::new(id),
            secret_access_key: Secret::new(secret),
            session_token: token.map(Secret::new),
        }),
        (Some(_), None) | (None, Some(_)) => Found::Partial,
        _ if seen => Found::NoKeys,
        _ => Found::NoProfile { config_style },
    }
}

/// Reads a credentials file, refusing one past [`FILE_LIMIT`].
/// A regular file only: a FIFO at the path would hold the reading thread for ever
/// (`config::read`).
pub fn read(path: &Path) -> std::io::Result<String> {
    super::read::bounded_text(path, FILE_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# written by aws configure
[default]
aws_access_key_id = AKIDDEFAULT
aws_secret_access_key = secret/default+1

[ci]
AWS_ACCESS_KEY_ID=AKIDCI
aws_secret_access_key=secret-ci
aws_security_token = token-ci
; a comment
[sso-user]
sso_session = corp
sso_account_id = 123456789012
";

    #[test]
    fn a_profile_yields_its_keys_and_token() {
        assert_eq!(
            find(FILE, "default"),
            Found::Keys(ProfileKeys {
                access_key_id: Secret::new("AKIDDEFAULT".into()),
                secret_access_key: Secret::new("secret/default+1".into()),
                session_token: None,
            })
        );
        assert_eq!(
            find(FILE, "ci"),
            Found::Keys(ProfileKeys {
                access_key_id: Secret::new("AKIDCI".into()),
                secret_access_key: Secret::new("secret-ci".into()),
                session_token: Some(Secret::new("token-ci".into())),
            })
        );
    }

    #[test]
    fn a_profile_without_keys_or_absent_is_told_apart() {
        assert_eq!(find(FILE, "sso-user"), Found::NoKeys);
        let absent = Found::NoProfile {
            config_style: false,
        };
        assert_eq!(find(FILE, "prod"), absent);
        assert_eq!(find("", "default"), absent);
        // Keys of another profile are never taken; one key of two is told apart.
        assert_eq!(
            find(
                "[a]\naws_access_key_id=X\n[b]\naws_secret_access_key=Y\n",
                "b"
            ),
            Found::Partial
        );
        assert_eq!(
            find("[profile dev]\naws_access_key_id=X\n", "dev"),
            Found::NoProfile { config_style: true }
        );
    }

    #[test]
    fn a_byte_order_mark_and_crlf_lines_are_read_through() {
        let text = "\u{feff}[default]\r\naws_access_key_id = A\r\naws_secret_access_key = B\r\n";
        assert!(matches!(find(text, "default"), Found::Keys(_)));
    }

    #[test]
    fn an_oversize_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials");
        std::fs::write(&path, vec![b'#'; (FILE_LIMIT + 1) as usize]).unwrap();
        assert!(read(&path).is_err());
        std::fs::write(&path, FILE).unwrap();
        assert_eq!(read(&path).unwrap(), FILE);
    }
}
