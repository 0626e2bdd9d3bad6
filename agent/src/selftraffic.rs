//! The agent's own traffic: requests it makes to the engines it captures
//! (scrapes of their `/metrics`) go through the engines' captured sockets,
//! so the decoder sees them like any client's. Each carries a header whose
//! value is a random token made once per run; the decoder marks requests
//! that carry it, and the pipeline counts and drops them. A client cannot
//! hide its requests by sending the header: it does not know the token.
//!
//! Owns: the header's name and the token. Must not: be matched by address
//! (the first connection after the agent starts, or a very short one, may
//! have no known peer address).

/// Request header carrying the token.
pub const HEADER: &str = "x-tokentap-self";

/// A random token, 32 hex digits (128 bits from the kernel's CSPRNG).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker(String);

impl Marker {
    pub fn new() -> Self {
        let mut b = [0u8; 16];
        // SAFETY: writes at most b.len() bytes into b.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
        if n != b.len() as isize {
            // No entropy source: still unique per run and unguessable enough
            // to not be sent by accident.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            b = (t ^ ((std::process::id() as u128) << 64)).to_le_bytes();
        }
        Marker(b.iter().map(|x| format!("{x:02x}")).collect())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a request header value is this token.
    pub fn matches(&self, value: &[u8]) -> bool {
        value.trim_ascii() == self.0.as_bytes()
    }
}

impl Default for Marker {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_hex_and_match_only_themselves() {
        let (a, b) = (Marker::new(), Marker::new());
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(a.matches(format!(" {} ", a.as_str()).as_bytes()));
        assert!(!a.matches(b.as_str().as_bytes()));
        assert!(!a.matches(b""));
    }
}
