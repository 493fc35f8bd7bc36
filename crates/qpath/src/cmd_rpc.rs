//! `qpath rpc METHOD [PARAMS]`.

use std::path::PathBuf;

use serde_json::{Map, Value};

/// Arguments of `qpath rpc`.
#[derive(clap::Args, Debug)]
pub struct RpcArgs {
    /// Control socket of the target.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Method, e.g. list_queues, set_ana_state, add_namespace.
    method: String,
    /// Parameters: one JSON object, or key=value pairs (values parsed as JSON when they can be).
    params: Vec<String>,
}

pub fn run(a: RpcArgs) -> Result<(), Box<dyn std::error::Error>> {
    let socket = a.socket.unwrap_or_else(crate::default_rpc_socket);
    let params = parse_params(&a.params)?;
    let result = target::rpc::client_call(&socket, &a.method, params)?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}

fn parse_params(args: &[String]) -> Result<Value, String> {
    if let [one] = args
        && one.trim_start().starts_with('{')
    {
        return serde_json::from_str(one).map_err(|e| format!("params: {e}"));
    }
    let mut m = Map::new();
    for kv in args {
        let (k, v) = kv.split_once('=').ok_or_else(|| format!("{kv:?}: expected key=value"))?;
        let val = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
        m.insert(k.to_string(), val);
    }
    Ok(Value::Object(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params() {
        let v = parse_params(&["port=2".into(), "state=inaccessible".into(), "group=1".into()]).unwrap();
        assert_eq!(v["port"], 2);
        assert_eq!(v["state"], "inaccessible");
        let v = parse_params(&[r#"{"a": [1]}"#.into()]).unwrap();
        assert_eq!(v["a"][0], 1);
        assert!(parse_params(&["nokey".into()]).is_err());
    }
}
