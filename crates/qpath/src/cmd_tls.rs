//! `qpath gen-tls-key` and `qpath check-tls-key`: nvme-cli's commands for TLS PSKs in the
//! PSK interchange format (`NVMeTLSkey-1:<hh>:<base64>:`), and the identity a host
//! presents with one. A generated key is printed (it is the command's output); a checked
//! key never is: its hash and fingerprint are.

use tls::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash};

/// `qpath gen-tls-key`.
#[derive(clap::Args, Debug)]
pub struct GenArgs {
    /// Hash of the key (and cipher suite): 1 = SHA-256 (32-byte key), 2 = SHA-384 (48).
    #[arg(short = 'm', long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    hmac: u8,
    /// The key bytes in hexadecimal (default: random).
    #[arg(short = 's', long)]
    secret: Option<String>,
    #[command(flatten)]
    id: IdArgs,
}

/// `qpath check-tls-key`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The key to check (interchange format), or the path of a file holding it.
    #[arg(short = 'k', long)]
    key: String,
    #[command(flatten)]
    id: IdArgs,
}

/// The identity to print for a host and subsystem.
#[derive(clap::Args, Debug)]
pub struct IdArgs {
    /// Host NQN: with --subsysnqn, print the PSK identity this host presents.
    #[arg(short = 'n', long)]
    hostnqn: Option<String>,
    /// Subsystem NQN.
    #[arg(short = 'c', long)]
    subsysnqn: Option<String>,
    /// Identity version: 1 (with the PSK digest) or 0.
    #[arg(short = 'I', long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    identity: u8,
}

type R = Result<(), Box<dyn std::error::Error>>;

fn hex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) {
        return Err("the secret has an odd number of hex digits".into());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| "the secret is not hexadecimal".to_string()))
        .collect()
}

fn identity(key: &ConfiguredPsk, a: &IdArgs) {
    if let (Some(h), Some(s)) = (&a.hostnqn, &a.subsysnqn) {
        let v = if a.identity == 0 { IdentityVersion::V0 } else { IdentityVersion::V1 };
        println!("{}", key.retained(h, Derivation::Standard).identity(v, h, s));
    }
}

pub fn generate(a: GenArgs) -> R {
    let hash = PskHash::from_id(a.hmac).ok_or("--hmac is 1 or 2")?;
    let key = match &a.secret {
        None => ConfiguredPsk::generate(hash)?,
        Some(s) => ConfiguredPsk::new(Some(hash), &zeroize::Zeroizing::new(hex(s)?))?,
    };
    println!("{}", &*key.to_interchange());
    identity(&key, &a.id);
    Ok(())
}

pub fn check(a: CheckArgs) -> R {
    let text = if a.key.trim_start().starts_with("NVMeTLSkey-") {
        zeroize::Zeroizing::new(a.key.clone())
    } else {
        zeroize::Zeroizing::new(std::fs::read_to_string(&a.key).map_err(|e| format!("TLS key file {}: {e}", a.key))?)
    };
    let key = ConfiguredPsk::parse(&text)?;
    let transform = key.transform().map_or("none", PskHash::name);
    println!(
        "valid TLS key: hash {} ({}), transform {transform}, fingerprint {}",
        key.hash().id(),
        key.hash().name(),
        key.fingerprint()
    );
    identity(&key, &a.id);
    Ok(())
}
