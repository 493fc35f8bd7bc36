//! `qpath rpc METHOD [PARAMS]`.
//!
//! Parameters are typed as HTTPie types a JSON request's fields: `key=value` is always a
//! string (so `backend=null`, `serial=1234` and `nqn=...` reach the target as written),
//! and `key:=JSON` is raw JSON, for numbers, booleans, arrays and objects
//! (`nsid:=2`, `grow:=true`, `ports:=[1,2]`). A single argument that starts with `{` is
//! the whole params object.

use std::path::PathBuf;

use serde_json::{Map, Value};

/// Arguments of `qpath rpc`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Parameters:
  key=value     a string, always: backend=null, serial=1234, nqn=nqn.2026-11.io.qpath:default
  key:=JSON     raw JSON: a number, boolean, array or object: port:=2, nsid:=1, grow:=true
  '{...}'       the whole params object as one JSON argument

Examples:
  qpath rpc get_target
  qpath rpc set_ana_state port:=2 group:=1 state=inaccessible
  qpath rpc add_namespace nqn=nqn.2026-11.io.qpath:default backend=ram size=1G
  qpath rpc set_limits '{\"pdu_timeout_ms\": 5000}'

A target's methods and their parameters are listed at the top of crates/target/src/rpc.rs;
a running `qpath bench --rpc-socket PATH` answers stats, target_stats, bench_status,
reauthenticate and release.")]
pub struct RpcArgs {
    /// Control socket of the target (default: $QPATH_RPC_SOCKET, else
    /// $XDG_RUNTIME_DIR/qpath.sock, else /tmp/qpath.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Method, e.g. get_target, list_queues, set_ana_state, add_namespace.
    method: String,
    /// Parameters: key=value (a string), key:=JSON (a number, boolean, array or object),
    /// or one JSON object.
    params: Vec<String>,
}

pub fn run(a: RpcArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = a.socket.unwrap_or_else(crate::default_rpc_socket);
    let params = parse_params(&a.params)?;
    match target::rpc::client_call(&socket, &a.method, params) {
        Ok(result) => {
            println!("{}", serde_json::to_string_pretty(&result)?);
            Ok(())
        }
        Err(e) => match typed_hint(&a.params) {
            Some(hint) => Err(format!("{e}\nhint: {hint}").into()),
            None => Err(e.into()),
        },
    }
}

/// One `key=value` or `key:=JSON` argument, split.
#[derive(Debug, PartialEq)]
enum Param<'a> {
    /// `key=value`: the value is a string.
    Text(&'a str, &'a str),
    /// `key:=JSON`: the value is raw JSON.
    Json(&'a str, &'a str),
}

fn split_param(arg: &str) -> Result<Param<'_>, String> {
    let (k, v) = arg.split_once('=').ok_or_else(|| {
        format!("{arg:?}: expected key=value (a string) or key:=JSON (a number, boolean, array or object)")
    })?;
    let (key, raw) = match k.strip_suffix(':') {
        Some(key) => (key, true),
        None => (k, false),
    };
    if key.is_empty() {
        return Err(format!("{arg:?}: the parameter has no name"));
    }
    Ok(if raw { Param::Json(key, v) } else { Param::Text(key, v) })
}

fn parse_params(args: &[String]) -> Result<Value, String> {
    if let [one] = args
        && one.trim_start().starts_with('{')
    {
        let v: Value = serde_json::from_str(one).map_err(|e| format!("params {one:?}: not a JSON object: {e}"))?;
        return match v {
            Value::Object(_) => Ok(v),
            _ => Err(format!("params {one:?}: not a JSON object")),
        };
    }
    let mut m = Map::new();
    for arg in args {
        let (key, val) = match split_param(arg)? {
            Param::Text(k, v) => (k, Value::String(v.to_string())),
            Param::Json(k, v) => (
                k,
                serde_json::from_str(v)
                    .map_err(|e| format!("{arg:?}: {v:?} is not JSON ({e}); for a string write {k}={v} (one '=')"))?,
            ),
        };
        if m.insert(key.to_string(), val).is_some() {
            return Err(format!("parameter {key:?} is given twice"));
        }
    }
    Ok(Value::Object(m))
}

/// When a call failed and some `key=value` looks like a number, boolean or null: the
/// reminder that it was sent as a string, and how to send it typed.
fn typed_hint(args: &[String]) -> Option<String> {
    let typed: Vec<String> = args
        .iter()
        .filter_map(|a| match split_param(a) {
            Ok(Param::Text(k, v))
                if serde_json::from_str::<Value>(v).is_ok_and(|j| j.is_number() || j.is_boolean()) =>
            {
                Some(format!("{k}:={v}"))
            }
            _ => None,
        })
        .collect();
    if typed.is_empty() {
        return None;
    }
    Some(format!("key=value sends a string; if the method wants a number or boolean there, write {}", typed.join(" ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Value, String> {
        parse_params(&args.iter().map(|s| (*s).to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn key_value_is_always_a_string() {
        let v = p(&["backend=null", "serial=1234", "grow=true", "state=inaccessible", "empty="]).unwrap();
        assert_eq!(v["backend"], "null");
        assert_eq!(v["serial"], "1234");
        assert_eq!(v["grow"], "true");
        assert_eq!(v["state"], "inaccessible");
        assert_eq!(v["empty"], "");
        // Values may hold '=' and ':' (NQNs, DH-HMAC-CHAP secrets).
        let v = p(&["nqn=nqn.2026-11.io.qpath:default", "dhchap_secret=DHHC-1:00:abc=:"]).unwrap();
        assert_eq!(v["nqn"], "nqn.2026-11.io.qpath:default");
        assert_eq!(v["dhchap_secret"], "DHHC-1:00:abc=:");
    }

    #[test]
    fn key_colon_equals_is_raw_json() {
        let v = p(&["port:=2", "grow:=true", "ports:=[1,2]", "qos:={\"iops\":5}", "x:=null", "s:=\"7\""]).unwrap();
        assert_eq!(v["port"], 2);
        assert_eq!(v["grow"], true);
        assert_eq!(v["ports"][1], 2);
        assert_eq!(v["qos"]["iops"], 5);
        assert!(v["x"].is_null());
        assert_eq!(v["s"], "7");
        let e = p(&["state:=inaccessible"]).unwrap_err();
        assert!(e.contains("not JSON") && e.contains("state=inaccessible"), "{e}");
    }

    #[test]
    fn whole_object_no_params_and_mistakes() {
        assert_eq!(p(&[r#"{"a": [1]}"#]).unwrap()["a"][0], 1);
        assert_eq!(p(&[]).unwrap(), Value::Object(Map::new()), "no params: an empty object");
        assert!(p(&["{nope"]).unwrap_err().contains("not a JSON object"));
        assert!(p(&["nokey"]).unwrap_err().contains("expected key=value"));
        assert!(p(&["=1"]).unwrap_err().contains("no name"));
        assert!(p(&[":=1"]).unwrap_err().contains("no name"));
        assert!(p(&["a=1", "a:=2"]).unwrap_err().contains("twice"));
    }

    #[test]
    fn a_failed_call_hints_at_typed_values() {
        let args: Vec<String> = ["port=2", "group=1", "state=inaccessible", "grow=true", "nsid:=1", "backend=null"]
            .iter()
            .map(|s| (*s).to_string())
            .collect();
        let h = typed_hint(&args).unwrap();
        assert!(h.contains("port:=2 group:=1 grow:=true"), "{h}");
        assert!(!h.contains("state") && !h.contains("nsid") && !h.contains("backend"), "{h}");
        assert_eq!(typed_hint(&["backend=ram".to_string()]), None);
    }
}
