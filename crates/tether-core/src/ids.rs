//! Identifier newtypes.
//!
//! Ids minted by the endpoint are opaque: clients must not read meaning into
//! their shape. Ids given by clients (`command_id`, `device_id`) are checked for
//! a bounded, printable shape before anything else sees them.

use std::fmt;

/// Longest id accepted from a client, in bytes.
pub const CLIENT_ID_LEN_MAX: usize = 128;

/// Why a client-supplied id was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdError(pub &'static str);

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

fn check_client_id(raw: &str) -> Result<(), IdError> {
    if raw.is_empty() {
        return Err(IdError("empty"));
    }
    if raw.len() > CLIENT_ID_LEN_MAX {
        return Err(IdError("longer than 128 bytes"));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/');
    if !raw.chars().all(allowed) {
        return Err(IdError(
            "only ASCII letters, digits and - _ . : / are allowed",
        ));
    }
    Ok(())
}

macro_rules! client_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Checks the shape of a client-supplied id.
            ///
            /// # Errors
            /// Empty, longer than [`CLIENT_ID_LEN_MAX`], or characters outside `[A-Za-z0-9-_.:/]`.
            pub fn parse(raw: &str) -> Result<Self, IdError> {
                check_client_id(raw)?;
                Ok(Self(raw.to_owned()))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

client_id!(
    /// A device id, unique within an endpoint.
    DeviceId
);
client_id!(
    /// The idempotency key of a command (a ULID is recommended).
    CommandId
);

impl CommandId {
    /// Mints a fresh ULID command id (for CLI use and internal commands).
    pub fn mint() -> Self {
        Self(ulid::Ulid::new().to_string())
    }
}

/// Mints an opaque endpoint id with a prefix: `<prefix><ULID>`.
pub fn mint(prefix: &str) -> String {
    format!("{prefix}{}", ulid::Ulid::new())
}

/// A fresh bearer token for a principal: `tt_` and 32 random bytes from the
/// operating system's generator, in hex (256 bits: never guessed).
pub fn token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let mut out = String::with_capacity(3 + 64);
    out.push_str("tt_");
    for b in bytes {
        use std::fmt::Write as _;
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Mints an unguessable id: `<prefix><ULID>_<64 random bits hex>`.
pub fn mint_secret(prefix: &str) -> String {
    let extra: u64 = rand::random();
    format!("{prefix}{}_{extra:016x}", ulid::Ulid::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_refuse_empty_long_and_odd_characters() {
        assert!(CommandId::parse("").is_err());
        assert!(CommandId::parse(&"a".repeat(129)).is_err());
        assert!(CommandId::parse("a b").is_err());
        assert!(CommandId::parse("01J9ZQ-abc_1.2:x/y").is_ok());
    }

    #[test]
    fn minted_secret_ids_differ() {
        assert_ne!(mint_secret("s_"), mint_secret("s_"));
        assert!(mint("op_").starts_with("op_"));
    }
}
