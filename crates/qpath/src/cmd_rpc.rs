//! `qpath rpc METHOD [PARAMS]`, `qpath rpc --list`, `qpath rpc METHOD --help`.
//!
//! Parameters are written as HTTPie writes a JSON request's fields: `key=value` sends a
//! string, which the target converts to the parameter's type where its schema says
//! integer, number, boolean or size (`nsid=1`, `grow=true`, `size=2G`), and `key:=JSON` sends
//! raw JSON, for arrays and tables (`ports:=[1,2]`) or to be explicit (`nsid:=1`). A single
//! argument that starts with `{` is the whole params object.
//!
//! The methods and their parameters come from the process that answers on the socket
//! (`rpc_get_methods`): a target's socket describes the target's, a bench's its own.

use std::path::{Path, PathBuf};

use clap::{ArgAction, Args, Command};
use serde_json::{Map, Value};

const AFTER_HELP: &str = "\
Parameters:
  key=value     a string; the target converts it to the parameter's type (integer,
                boolean, size): nsid=1, grow=true, size=2G, backend=null, serial=1234
  key:=JSON     raw JSON: arrays, tables, or a typed value: ports:=[1,2], nsid:=1
  '{...}'       the whole params object as one JSON argument

Examples:
  qpath rpc --list                  the methods of the target on the socket
  qpath rpc add_namespace --help    a method's parameters: type, required or default
  qpath rpc get_target
  qpath rpc set_ana_state port=2 group=1 state=inaccessible
  qpath rpc add_namespace nqn=nqn.2026-11.io.qpath:default backend=ram size=1G
  qpath rpc set_limits '{\"pdu_timeout_ms\": 5000}'

Methods and parameters come from the process on the socket: a running
`qpath bench --rpc-socket PATH` lists its own (stats, target_stats, bench_status,
reauthenticate, release).

Exit status: 0 when the call succeeded, 75 when the target answered that it could
not do it now and the same call may succeed later (a shrink whose blocks still have
writes in flight), 1 for any other failure.";

/// Arguments of `qpath rpc`.
#[derive(Args, Debug)]
#[command(disable_help_flag = true, after_help = AFTER_HELP)]
pub struct RpcArgs {
    /// Control socket of the target (default: $QPATH_RPC_SOCKET, else
    /// $XDG_RUNTIME_DIR/qpath.sock or /tmp/qpath.sock, else the service's
    /// /run/qpath/qpath.sock when only that one exists).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// List the methods of the process on the socket, one line each.
    #[arg(long, conflicts_with = "method")]
    list: bool,
    /// Print this help; after a METHOD, that method's parameters as the process on the
    /// socket describes them.
    #[arg(short = 'h', long = "help", action = ArgAction::SetTrue)]
    help: bool,
    /// Method, e.g. get_target, list_queues, set_ana_state, add_namespace.
    method: Option<String>,
    /// Parameters: key=value (a string, converted to the parameter's type), key:=JSON (raw
    /// JSON), or one JSON object.
    params: Vec<String>,
}

pub fn run(a: RpcArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = a.socket.clone().unwrap_or_else(crate::client_rpc_socket);
    if a.list {
        return list(&socket);
    }
    // `qpath rpc help [METHOD]`: as `qpath rpc --list` / `qpath rpc METHOD --help`.
    let (method, help) = match (a.method.as_deref(), a.params.first()) {
        (Some("help"), None) => return list(&socket),
        (Some("help"), Some(m)) => (m.as_str(), true),
        (Some(m), _) => (m, a.help),
        (None, _) if a.help => {
            let about = "Call a running target's (or bench's) JSON-RPC control socket.";
            RpcArgs::augment_args(Command::new("qpath rpc")).about(about).print_long_help()?;
            return Ok(());
        }
        (None, _) => {
            return Err("name a method (`qpath rpc --list` lists them; `qpath rpc --help` says how to call one)".into());
        }
    };
    if help {
        return method_help(&socket, method);
    }
    let params = parse_params(&a.params)?;
    match target::rpc::client_call(&socket, method, params) {
        Ok(result) => {
            println!("{}", serde_json::to_string_pretty(&result)?);
            Ok(())
        }
        Err(e) if e.kind == target::ErrorKind::Busy => {
            // The target could not do it now; the same call may succeed later. Scripts
            // retry on this status (sysexits' EX_TEMPFAIL) rather than on every failure.
            eprintln!("qpath: {}", explain(&socket, method, &e));
            std::process::exit(EX_TEMPFAIL);
        }
        Err(e) => Err(explain(&socket, method, &e).into()),
    }
}

/// The exit status of a call the target answered "busy, try again" (sysexits.h).
const EX_TEMPFAIL: i32 = 75;

/// A failed call, said for a person: who did not answer, or what to read next.
fn explain(socket: &Path, method: &str, e: &target::Error) -> String {
    let io = e.source.as_ref().and_then(|s| s.downcast_ref::<std::io::Error>());
    if e.context.starts_with("connect to ")
        && let Some(io) = io
    {
        return format!(
            "no qpath target answers on {} ({io}): start one with `qpath target`, or name its socket with \
             --socket PATH (or $QPATH_RPC_SOCKET)",
            socket.display()
        );
    }
    let text = e.to_string();
    if text.contains("unknown method") {
        format!("{text}\n`qpath rpc --list` lists the methods")
    } else if text.contains("unknown parameter") || text.contains("missing parameter") || text.contains("expected ") {
        format!("{text}\n`qpath rpc {method} --help` describes its parameters")
    } else {
        text
    }
}

/// The process's methods (`rpc_get_methods`).
fn methods(socket: &Path) -> Result<Vec<Value>, String> {
    match target::rpc::client_call(socket, "rpc_get_methods", Value::Object(Map::new())) {
        Ok(Value::Array(all)) => Ok(all),
        Ok(other) => Err(format!("the process on {} answered rpc_get_methods with {other}", socket.display())),
        Err(e) if e.to_string().contains("unknown method") => {
            Err(format!("the process on {} does not list its methods (an older qpath?): {e}", socket.display()))
        }
        Err(e) => Err(explain(socket, "rpc_get_methods", &e)),
    }
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// `qpath rpc --list`: one line per method.
fn list(socket: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let all = methods(socket)?;
    let width = all.iter().map(|m| text(m, "name").len()).max().unwrap_or(0);
    println!(
        "Methods on {} (config: changes the configuration; state: acts on the running process):",
        socket.display()
    );
    for m in &all {
        let changes = match text(m, "changes") {
            "configuration" => "config",
            "state" => "state",
            _ => "",
        };
        println!("  {:width$}  {changes:6}  {}", text(m, "name"), text(m, "description"));
    }
    println!("\n`qpath rpc METHOD --help` describes a method's parameters.");
    Ok(())
}

/// A parameter's type as help shows it: "integer 1..65535", "null|ram|file", "array of table".
fn type_text(t: &Value) -> String {
    match text(t, "type") {
        "integer" => {
            let (min, max) = (t["minimum"].as_i64().unwrap_or(0), t["maximum"].as_u64().unwrap_or(u64::MAX));
            if min == 0 && [u64::from(u16::MAX), u64::from(u32::MAX), u64::MAX].contains(&max) {
                "integer".into()
            } else {
                format!("integer {min}..{max}")
            }
        }
        "enum" => t["values"]
            .as_array()
            .map_or_else(String::new, |v| v.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("|")),
        "array" => format!("array of {}", type_text(&t["items"])),
        "object" => "table".into(),
        "one_of" => t["one_of"]
            .as_array()
            .map_or_else(String::new, |v| v.iter().map(type_text).collect::<Vec<_>>().join(" or ")),
        other => other.into(),
    }
}

/// The fields of the tables a parameter of type `t` holds (an object, an array of them, or
/// a choice with one).
fn table_fields(t: &Value) -> Option<&Vec<Value>> {
    match text(t, "type") {
        "object" => t["fields"].as_array(),
        "array" => table_fields(&t["items"]),
        "one_of" => t["one_of"].as_array()?.iter().find_map(table_fields),
        _ => None,
    }
}

/// One row per parameter, and per field of a table it holds (`hosts[].nqn`).
fn param_rows(params: &[Value], prefix: &str, rows: &mut Vec<[String; 4]>) {
    for p in params {
        let name = format!("{prefix}{}", text(p, "name"));
        let need = if p["required"] == true {
            "required".to_string()
        } else if let Some(d) = p.get("default") {
            format!("default {d}")
        } else {
            "optional".to_string()
        };
        let mut ty = type_text(p);
        if p["secret"] == true {
            ty.push_str(", secret");
        }
        rows.push([name.clone(), ty, need, text(p, "description").to_string()]);
        if let Some(fields) = table_fields(p) {
            let inner = if text(p, "type") == "object" { format!("{name}.") } else { format!("{name}[].") };
            param_rows(fields, &inner, rows);
        }
    }
}

/// `qpath rpc METHOD --help`: the method's parameters as the process on the socket says.
fn method_help(socket: &Path, method: &str) -> Result<(), Box<dyn std::error::Error>> {
    let all = methods(socket)?;
    let Some(m) = all.iter().find(|m| text(m, "name") == method) else {
        let near = target::rpc::schema::closest(method, all.iter().map(|m| text(m, "name")))
            .map(|n| format!(" (did you mean {n:?}?)"))
            .unwrap_or_default();
        return Err(format!("no method {method:?} on {}{near}; `qpath rpc --list` lists them", socket.display()).into());
    };
    let changes = match text(m, "changes") {
        "configuration" => " It changes the configuration (saved under `qpath target --persist`).",
        "state" => " It acts on the running process (not saved).",
        _ => "",
    };
    println!("{method}: {}.{changes}\n", text(m, "description"));
    let mut rows = Vec::new();
    param_rows(m["params"].as_array().map_or(&[][..], Vec::as_slice), "", &mut rows);
    if rows.is_empty() {
        println!("No parameters.");
    } else {
        println!("Parameters:");
        let w: Vec<usize> = (0..3).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
        for [name, ty, need, about] in &rows {
            println!("  {name:w0$}  {ty:w1$}  {need:w2$}  {about}", w0 = w[0], w1 = w[1], w2 = w[2]);
        }
    }
    println!("\nAnswers: {}", text(m, "result"));
    println!(
        "\nkey=value sends a string, converted to the parameter's type (integer, boolean, size); \
         key:=JSON sends raw JSON (arrays, tables)."
    );
    Ok(())
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
        format!("{arg:?}: expected key=value (a string, converted to the parameter's type) or key:=JSON (raw JSON)")
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(args: &[&str]) -> Result<Value, String> {
        parse_params(&args.iter().map(|s| (*s).to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn key_value_is_sent_as_a_string() {
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
    fn help_rows_show_types_defaults_secrets_and_nested_tables() {
        let params = json!([
            {"name": "id", "type": "integer", "minimum": 1, "maximum": 65535, "required": true, "description": "port", "secret": false},
            {"name": "nsid", "type": "integer", "minimum": 0, "maximum": 4294967295u64, "required": false, "default": 0, "description": "n", "secret": false},
            {"name": "kind", "type": "enum", "values": ["io", "discovery"], "required": false, "default": "io", "description": "k", "secret": false},
            {"name": "key", "type": "string", "required": false, "description": "secret", "secret": true},
            {"name": "hosts", "type": "array", "required": false, "default": [], "description": "h", "secret": false,
             "items": {"type": "one_of", "one_of": [{"type": "string"}, {"type": "object", "fields": [
                 {"name": "nqn", "type": "string", "required": true, "description": "host", "secret": false}]}]}},
        ]);
        let mut rows = Vec::new();
        param_rows(params.as_array().unwrap(), "", &mut rows);
        let row = |i: usize| rows[i].iter().map(String::as_str).collect::<Vec<_>>();
        assert_eq!(row(0), ["id", "integer 1..65535", "required", "port"]);
        assert_eq!(row(1), ["nsid", "integer", "default 0", "n"]);
        assert_eq!(row(2), ["kind", "io|discovery", "default \"io\"", "k"]);
        assert_eq!(row(3), ["key", "string, secret", "optional", "secret"]);
        assert_eq!(row(4), ["hosts", "array of string or table", "default []", "h"]);
        assert_eq!(row(5), ["hosts[].nqn", "string", "required", "host"]);
    }
}
