//! The schema of a socket's methods: each method's name, a one-line description, what it
//! changes, its parameters (name, type, required or default, a one-line description,
//! whether it is a secret) and what it answers.
//!
//! The schema is what the socket checks a request against before a method runs
//! ([`Method::check`]): an unknown parameter is refused with the method's parameters (and
//! the closest name), a missing one is named, and a string where the schema wants an
//! integer, a number, a boolean or a size is converted (`qpath rpc`'s `key=value` always
//! sends a string), so the method sees typed JSON. A value that does not convert is refused
//! with the parameter, its type and the value (never a secret's value). Nested tables (a
//! subsystem's namespaces and hosts) are checked the same way, their fields named by path
//! (`namespace[0].block_size`). [`Method::redacted`] is the request as the audit log shows
//! it, and [`describe`] the table as `rpc_get_methods` answers it.

use serde_json::{Map, Value, json};

use crate::error::{Error, ErrorKind};

/// The method every socket answers with its own table (SPDK's name).
pub const GET_METHODS: &str = "rpc_get_methods";

/// What a method does to the process that serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Answers from the state; changes nothing.
    Reads,
    /// Acts on the running process (faults, reservations, a file written, a run released)
    /// without changing its configuration. Logged as a change.
    Acts,
    /// Changes the configuration (saved under `qpath target --persist`). Logged as a change.
    Configures,
}

impl Effect {
    /// Whether the method changes anything (and so leaves a line in the audit log).
    pub fn changes(self) -> bool {
        self != Effect::Reads
    }
}

/// A parameter's type.
#[derive(Clone, Copy, Debug)]
pub enum Type {
    /// A string.
    String,
    /// An integer in `min..=max` (a string of digits, or `0x` and hex digits, converts).
    Integer {
        /// Smallest value.
        min: i64,
        /// Largest value.
        max: u64,
    },
    /// A number, integer or not (a string that reads as one converts).
    Number,
    /// `true` or `false` (the strings `"true"` and `"false"` convert).
    Boolean,
    /// Bytes: an integer, or a string with a binary unit (`"512M"`, `"2G"`).
    Size,
    /// One of these strings; `"a|b"` is the name `a` with the alias `b`.
    Enum(&'static [&'static str]),
    /// A list of values of one type.
    Array(&'static Type),
    /// A table of fields.
    Object(&'static [Param]),
    /// The first of these types the value's JSON kind fits (a host NQN or a host table).
    OneOf(&'static [Type]),
}

/// An integer that fits 16 bits unsigned.
pub const U16: Type = Type::Integer { min: 0, max: u16::MAX as u64 };
/// An integer that fits 32 bits unsigned.
pub const U32: Type = Type::Integer { min: 0, max: u32::MAX as u64 };
/// An integer that fits 64 bits unsigned.
pub const U64: Type = Type::Integer { min: 0, max: u64::MAX };

/// Whether a parameter must be given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// It must.
    Required,
    /// It may be left out; its description says what that means.
    Optional,
    /// It may be left out, and then has this value (JSON text).
    Default(&'static str),
}

/// One parameter of a method (or one field of a table).
#[derive(Clone, Copy, Debug)]
pub struct Param {
    /// Its name in the params object.
    pub name: &'static str,
    /// Its type.
    pub ty: Type,
    /// Whether it must be given.
    pub need: Need,
    /// One line: what it is.
    pub about: &'static str,
    /// A secret: its value never reaches a log or an answer.
    pub secret: bool,
}

impl Param {
    /// A parameter that must be given.
    pub const fn required(name: &'static str, ty: Type, about: &'static str) -> Param {
        Param { name, ty, need: Need::Required, about, secret: false }
    }

    /// A parameter that may be left out (its description says what that means).
    pub const fn optional(name: &'static str, ty: Type, about: &'static str) -> Param {
        Param { name, ty, need: Need::Optional, about, secret: false }
    }

    /// A parameter with a default value (`default` is JSON text: `0`, `false`, `"io"`).
    pub const fn default(name: &'static str, ty: Type, default: &'static str, about: &'static str) -> Param {
        Param { name, ty, need: Need::Default(default), about, secret: false }
    }

    /// The same parameter, marked as a secret.
    pub const fn secret(self) -> Param {
        Param { secret: true, ..self }
    }
}

/// One method of a socket: its schema, and `run`, what serves it (the target's methods
/// carry their function; the table is the dispatch).
#[derive(Debug)]
pub struct Method<R: 'static = ()> {
    /// Its name.
    pub name: &'static str,
    /// One line: what it does.
    pub summary: &'static str,
    /// What it changes.
    pub effect: Effect,
    /// Its parameters, in the order help lists them.
    pub params: &'static [Param],
    /// One line: what it answers.
    pub result: &'static str,
    /// What serves it.
    pub run: R,
}

/// `rpc_get_methods` itself, listed first in every socket's answer.
const GET_METHODS_METHOD: Method = Method {
    name: GET_METHODS,
    summary: "Lists this socket's methods with their descriptions and parameters",
    effect: Effect::Reads,
    params: &[],
    result: "[{name, description, changes, params: [{name, type, required, default, description, secret}], result}]",
    run: (),
};

/// The socket's methods as `rpc_get_methods` answers them: `rpc_get_methods` first, then
/// `methods` in their order. No value of a secret is in it (a secret has no default).
pub fn describe<R>(methods: &[Method<R>]) -> Value {
    let mut all = vec![GET_METHODS_METHOD.describe()];
    all.extend(methods.iter().map(Method::describe));
    Value::Array(all)
}

/// The method called `name`: unknown ones are refused, with the closest name.
pub fn find<'a, R>(methods: &'a [Method<R>], name: &str) -> Result<&'a Method<R>, Error> {
    if let Some(m) = methods.iter().find(|m| m.name == name) {
        return Ok(m);
    }
    let names = methods.iter().map(|m| m.name).chain([GET_METHODS]);
    let hint = match closest(name, names) {
        Some(near) => format!(" (did you mean {near:?}?)"),
        None => String::new(),
    };
    Err(Error::new(ErrorKind::NotFound, format!("unknown method {name:?}{hint}; {GET_METHODS} lists them")))
}

/// Checks `params` against `rpc_get_methods`'s schema (none).
pub fn check_get_methods(params: &Value) -> Result<(), Error> {
    GET_METHODS_METHOD.check(params).map(drop)
}

impl<R> Method<R> {
    /// The parameter called `name`.
    pub fn param(&self, name: &str) -> Option<&'static Param> {
        self.params.iter().find(|p| p.name == name)
    }

    /// `params` checked against the schema, typed: every parameter known, every required
    /// one given, strings converted where the type is an integer, number, boolean or size,
    /// `null` for a parameter that may be left out taken as left out (dropped). An error
    /// names the method, the parameter (by path, in a nested table) and what was wrong.
    pub fn check(&self, params: &Value) -> Result<Value, Error> {
        let bad = |e: String| Error::new(ErrorKind::Config, format!("{}: {e}", self.name));
        let object = match params {
            Value::Null => Map::new(),
            Value::Object(m) => m.clone(),
            other => return Err(bad(format!("params must be an object of named parameters, not {}", kind(other)))),
        };
        check_table(self.params, object, "", &format!("{} takes", self.name)).map(Value::Object).map_err(bad)
    }

    /// `params` as the audit log shows them: secrets as `<secret>`, and the value of any
    /// parameter the schema does not know (the call was refused) as `<not shown>`.
    pub fn redacted(&self, params: &Value) -> Value {
        redact_table(self.params, params)
    }

    /// The method as `rpc_get_methods` answers it.
    pub fn describe(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.summary,
            "changes": match self.effect {
                Effect::Reads => "nothing",
                Effect::Acts => "state",
                Effect::Configures => "configuration",
            },
            "params": self.params.iter().map(Param::describe).collect::<Vec<_>>(),
            "result": self.result,
        })
    }
}

impl Param {
    /// The parameter as `rpc_get_methods` answers it.
    pub fn describe(&self) -> Value {
        let mut d = Map::new();
        d.insert("name".into(), json!(self.name));
        if let Value::Object(t) = self.ty.describe() {
            d.extend(t);
        }
        d.insert("required".into(), json!(self.need == Need::Required));
        if let Need::Default(v) = self.need {
            // A default is JSON text written in the table (tested to parse).
            d.insert("default".into(), serde_json::from_str(v).unwrap_or_else(|_| json!(v)));
        }
        d.insert("description".into(), json!(self.about));
        d.insert("secret".into(), json!(self.secret));
        Value::Object(d)
    }
}

impl Type {
    /// The type as `rpc_get_methods` answers it: `{type, ...}` with the values of an
    /// enum, the bounds of an integer, the items of an array, the fields of a table.
    pub fn describe(&self) -> Value {
        match self {
            Type::String => json!({"type": "string"}),
            Type::Integer { min, max } => json!({"type": "integer", "minimum": min, "maximum": max}),
            Type::Number => json!({"type": "number"}),
            Type::Boolean => json!({"type": "boolean"}),
            Type::Size => json!({"type": "size"}),
            Type::Enum(values) => json!({
                "type": "enum",
                "values": values.iter().map(|v| enum_name(v)).collect::<Vec<_>>(),
            }),
            Type::Array(item) => json!({"type": "array", "items": item.describe()}),
            Type::Object(fields) => {
                json!({"type": "object", "fields": fields.iter().map(Param::describe).collect::<Vec<_>>()})
            }
            Type::OneOf(types) => {
                json!({"type": "one_of", "one_of": types.iter().map(Type::describe).collect::<Vec<_>>()})
            }
        }
    }

    /// What a value of this type is, for an error: "an integer from 0 to 65535".
    fn expected(&self) -> String {
        match self {
            Type::String => "a string".into(),
            Type::Integer { min: 0, max } if *max == u64::MAX => "an integer (0 or more)".into(),
            Type::Integer { min, max } => format!("an integer from {min} to {max}"),
            Type::Number => "a number".into(),
            Type::Boolean => "true or false".into(),
            Type::Size => "a size (bytes, or a number with a unit: 4096, 512M, 2G)".into(),
            Type::Enum(values) => {
                format!("one of {}", values.iter().map(|v| enum_name(v)).collect::<Vec<_>>().join(", "))
            }
            Type::Array(_) => "an array".into(),
            Type::Object(_) => "a table (a JSON object)".into(),
            Type::OneOf(types) => types.iter().map(Type::expected).collect::<Vec<_>>().join(" or "),
        }
    }
}

/// The name of an enum value written `"name|alias|..."`.
fn enum_name(v: &str) -> &str {
    v.split('|').next().unwrap_or(v)
}

/// What a JSON value is, for an error.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks one table (a method's params, or a nested table at `path`): `takes` begins the
/// list of its fields in an error ("set_qos takes", "a namespace[0] table takes").
fn check_table(
    fields: &[Param],
    mut given: Map<String, Value>,
    path: &str,
    takes: &str,
) -> Result<Map<String, Value>, String> {
    let at = |name: &str| if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
    let names = || fields.iter().map(|f| f.name).collect::<Vec<_>>().join(", ");
    if let Some(unknown) = given.keys().find(|k| !fields.iter().any(|f| f.name == k.as_str())) {
        let hint = match closest(unknown, fields.iter().map(|f| f.name)) {
            Some(near) => format!(" (did you mean {near:?}?)"),
            None => String::new(),
        };
        let list = if fields.is_empty() { "no parameters".to_string() } else { names() };
        return Err(format!("unknown parameter {:?}{hint}; {takes} {list}", at(unknown)));
    }
    let mut out = Map::new();
    for f in fields {
        match given.remove(f.name) {
            None | Some(Value::Null) if f.need == Need::Required => {
                return Err(format!("missing parameter {:?} ({}: {})", at(f.name), f.ty.expected(), f.about));
            }
            None | Some(Value::Null) => {}
            Some(v) => {
                out.insert(f.name.to_string(), convert(&f.ty, &at(f.name), v, f.secret)?);
            }
        }
    }
    Ok(out)
}

/// `v`, the value of the parameter at `path`, as type `ty` (converted from a string where
/// the type allows it), or why not: the path, the type, and the value unless it is a secret.
fn convert(ty: &Type, path: &str, v: Value, secret: bool) -> Result<Value, String> {
    let refuse = |v: &Value, hint: &str| {
        let shown = if secret {
            format!("{} (not shown: a secret)", kind(v))
        } else {
            let text = v.to_string();
            if text.len() > 80 { format!("{}...", text.chars().take(77).collect::<String>()) } else { text }
        };
        format!("{path}: expected {}, got {shown}{hint}", ty.expected())
    };
    match (ty, v) {
        (Type::String, v @ Value::String(_)) => Ok(v),
        (Type::Integer { min, max }, v) => {
            let n: Option<i128> = match &v {
                Value::Number(n) => n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from)),
                Value::String(s) => parse_integer(s),
                _ => None,
            };
            match n {
                Some(n) if n >= i128::from(*min) && n <= i128::from(*max) => Ok(if n < 0 {
                    json!(i64::try_from(n).unwrap_or(*min))
                } else {
                    json!(u64::try_from(n).unwrap_or(*max))
                }),
                _ => Err(refuse(&v, "")),
            }
        }
        (Type::Number, v) => {
            let n = match &v {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.trim().parse::<f64>().ok().filter(|f| f.is_finite()),
                _ => None,
            };
            match n {
                Some(_) if v.is_number() => Ok(v),
                Some(f) => Ok(json!(f)),
                None => Err(refuse(&v, "")),
            }
        }
        (Type::Boolean, Value::Bool(b)) => Ok(Value::Bool(b)),
        (Type::Boolean, Value::String(s)) if s == "true" || s == "false" => Ok(Value::Bool(s == "true")),
        (Type::Size, v) => {
            let ok = match &v {
                Value::Number(n) => n.as_u64().is_some(),
                Value::String(s) => crate::config::parse_size(s).is_ok(),
                _ => false,
            };
            if ok { Ok(v) } else { Err(refuse(&v, "")) }
        }
        (Type::Enum(values), Value::String(s)) if values.iter().any(|v| v.split('|').any(|a| a == s)) => {
            Ok(Value::String(s))
        }
        (Type::Enum(values), v @ Value::String(_)) => {
            let s = v.as_str().unwrap_or_default();
            let hint = match closest(s, values.iter().flat_map(|v| v.split('|'))) {
                Some(near) if !secret => format!(" (did you mean {near:?}?)"),
                _ => String::new(),
            };
            Err(refuse(&v, &hint))
        }
        (Type::Array(item), Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, x)| convert(item, &format!("{path}[{i}]"), x, secret))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        (Type::Object(fields), Value::Object(m)) => {
            check_table(fields, m, path, &format!("{path} takes")).map(Value::Object)
        }
        (Type::OneOf(types), v) => {
            for t in *types {
                match convert(t, path, v.clone(), secret) {
                    Ok(x) => return Ok(x),
                    // A table whose fields are wrong says so, rather than "expected a string".
                    Err(e) if matches!(t, Type::Object(_)) && v.is_object() => return Err(e),
                    Err(_) => {}
                }
            }
            Err(refuse(&v, ""))
        }
        (Type::Array(_), v @ Value::String(_)) => {
            Err(refuse(&v, " (on the command line, key:='[...]' gives an array)"))
        }
        (Type::Object(_), v @ Value::String(_)) => {
            Err(refuse(&v, " (on the command line, key:='{...}' gives a table)"))
        }
        (_, v) => Err(refuse(&v, "")),
    }
}

/// An integer written in decimal (with an optional `-`) or in hex after `0x`.
fn parse_integer(s: &str) -> Option<i128> {
    let t = s.trim();
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return i128::from_str_radix(hex, 16).ok().filter(|_| !hex.starts_with(['+', '-']));
    }
    if t.starts_with('+') {
        return None;
    }
    t.parse::<i128>().ok()
}

fn redact_table(fields: &[Param], v: &Value) -> Value {
    let Value::Object(m) = v else { return v.clone() };
    Value::Object(
        m.iter()
            .map(|(k, x)| {
                let shown = match fields.iter().find(|f| f.name == k.as_str()) {
                    Some(f) if f.secret => json!("<secret>"),
                    Some(f) => redact_value(&f.ty, x),
                    None => json!("<not shown>"),
                };
                (k.clone(), shown)
            })
            .collect(),
    )
}

fn redact_value(ty: &Type, v: &Value) -> Value {
    match (ty, v) {
        (Type::Object(fields), Value::Object(_)) => redact_table(fields, v),
        (Type::Array(item), Value::Array(items)) => Value::Array(items.iter().map(|x| redact_value(item, x)).collect()),
        (Type::OneOf(types), Value::Object(_)) => match types.iter().find(|t| matches!(t, Type::Object(_))) {
            Some(t) => redact_value(t, v),
            None => v.clone(),
        },
        _ => v.clone(),
    }
}

/// The name in `names` closest to `word` ("iops_limit" → "iops", "blocksize" →
/// "block_size"): within a few edits, or one holding the other.
pub fn closest<'a>(word: &str, names: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let w = word.to_ascii_lowercase();
    let mut best: Option<(usize, &str)> = None;
    for name in names {
        let n = name.to_ascii_lowercase();
        let d = edit_distance(&w, &n);
        let contains = n.len() >= 3 && w.len() >= 3 && (w.contains(&n) || n.contains(&w));
        let score = if d <= (w.len().max(n.len()) / 3).max(1) {
            d
        } else if contains {
            10
        } else {
            continue;
        };
        if best.is_none_or(|(s, _)| score < s) {
            best = Some((score, name));
        }
    }
    best.map(|(_, n)| n)
}

/// Edit distance counting a swap of two neighbours as one edit (optimal string alignment:
/// "nsdi" is one edit from "nsid"). Short names: the quadratic table is fine.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const QOS: &[Param] = &[
        Param::required("nqn", Type::String, "subsystem"),
        Param::required("nsid", U32, "namespace"),
        Param::default("iops", U64, "0", "IOPS"),
        Param::optional("grow", Type::Boolean, "grow"),
        Param::optional("size", Type::Size, "size"),
        Param::optional("state", Type::Enum(&["optimized|opt", "inaccessible"]), "state"),
        Param::optional("timeout_s", Type::Number, "seconds"),
        Param::optional("key", Type::String, "a key").secret(),
        Param::optional("opcode", Type::Integer { min: -1, max: 255 }, "opcode"),
    ];
    const HOST: &[Param] =
        &[Param::required("nqn", Type::String, "host"), Param::optional("dhchap_key", Type::String, "key").secret()];
    const NS: &[Param] = QOS.split_at(1).1;
    const TABLE: &[Param] = &[
        Param::required("nqn", Type::String, "subsystem"),
        Param::default("hosts", Type::Array(&Type::OneOf(&[Type::String, Type::Object(HOST)])), "[]", "hosts"),
        Param::default("namespace", Type::Array(&Type::Object(NS)), "[]", "namespaces"),
    ];
    const M: Method =
        Method { name: "set_it", summary: "sets it", effect: Effect::Configures, params: QOS, result: "{}", run: () };
    const T: Method =
        Method { name: "add_it", summary: "adds", effect: Effect::Configures, params: TABLE, result: "{}", run: () };

    fn err(m: &Method, v: Value) -> String {
        m.check(&v).unwrap_err().to_string()
    }

    #[test]
    fn strings_convert_to_the_schemas_types() {
        let v = M
            .check(&json!({
                "nqn": "n", "nsid": "1", "iops": "0x10", "grow": "true", "size": "2G",
                "state": "opt", "timeout_s": "2.5", "opcode": "-1", "key": "DHHC-1:00:x:",
            }))
            .unwrap();
        assert_eq!(v["nsid"], 1);
        assert_eq!(v["iops"], 16);
        assert_eq!(v["grow"], true);
        assert_eq!(v["size"], "2G", "a size stays as written; its unit is checked");
        assert_eq!(v["state"], "opt", "an alias is kept as written");
        assert_eq!(v["timeout_s"], 2.5);
        assert_eq!(v["opcode"], -1);
        assert_eq!(v["key"], "DHHC-1:00:x:");
        // Typed JSON passes as it is; null for an optional parameter leaves it out.
        let v = M.check(&json!({"nqn": "n", "nsid": 7, "grow": false, "size": 4096, "iops": null})).unwrap();
        assert_eq!(v, json!({"nqn": "n", "nsid": 7, "grow": false, "size": 4096}));
        assert_eq!(M.check(&Value::Null).unwrap_err().to_string(), err(&M, json!({})));
    }

    #[test]
    fn a_value_that_does_not_convert_names_the_parameter_its_type_and_the_value() {
        assert_eq!(
            err(&M, json!({"nqn": "n", "nsid": "3x"})),
            "set_it: nsid: expected an integer from 0 to 4294967295, got \"3x\""
        );
        assert!(err(&M, json!({"nqn": "n", "nsid": -1})).contains("nsid: expected an integer from 0"));
        assert!(err(&M, json!({"nqn": "n", "nsid": 1.5})).contains("got 1.5"));
        assert!(err(&M, json!({"nqn": "n", "nsid": "+1"})).contains("got \"+1\""));
        assert!(err(&M, json!({"nqn": "n", "nsid": 1, "opcode": 256})).contains("from -1 to 255, got 256"));
        assert_eq!(
            err(&M, json!({"nqn": "n", "nsid": 1, "grow": "yes"})),
            "set_it: grow: expected true or false, got \"yes\""
        );
        assert!(err(&M, json!({"nqn": "n", "nsid": 1, "size": "2X"})).contains("size: expected a size"));
        assert!(err(&M, json!({"nqn": "n", "nsid": 1, "size": -5})).contains("size: expected a size"));
        let e = err(&M, json!({"nqn": "n", "nsid": 1, "state": "optimised"}));
        assert!(
            e.contains("expected one of optimized, inaccessible") && e.contains("did you mean \"optimized\""),
            "{e}"
        );
        assert!(err(&M, json!({"nqn": 5, "nsid": 1})).contains("nqn: expected a string, got 5"));
        assert!(err(&M, json!({"nqn": "n", "nsid": 1, "timeout_s": "soon"})).contains("expected a number"));
        assert!(err(&M, json!([1])).contains("params must be an object"));
        // No serde jargon anywhere.
        assert!(!err(&M, json!({"nqn": "n", "nsid": "x"})).contains("invalid type"));
    }

    #[test]
    fn a_secrets_value_is_never_in_an_error() {
        let e = err(&M, json!({"nqn": "n", "nsid": 1, "key": 123456789}));
        assert!(e.contains("key: expected a string, got a number (not shown: a secret)"), "{e}");
        assert!(!e.contains("123456789"), "{e}");
        let e = err(&T, json!({"nqn": "n", "hosts": [{"nqn": "h", "dhchap_key": ["SECRETVALUE"]}]}));
        assert!(e.contains("hosts[0].dhchap_key") && !e.contains("SECRETVALUE"), "{e}");
    }

    #[test]
    fn unknown_and_missing_parameters_are_refused_with_the_methods_parameters() {
        let e = err(&M, json!({"nqn": "n", "nsid": 1, "iops_limit": 100}));
        assert_eq!(
            e,
            "set_it: unknown parameter \"iops_limit\" (did you mean \"iops\"?); set_it takes nqn, nsid, iops, \
             grow, size, state, timeout_s, key, opcode"
        );
        assert!(err(&M, json!({"nqn": "n", "nsdi": 1})).contains("did you mean \"nsid\""));
        assert!(!err(&M, json!({"nqn": "n", "nsid": 1, "zzz": 1})).contains("did you mean"));
        let e = err(&M, json!({"nqn": "n"}));
        assert_eq!(e, "set_it: missing parameter \"nsid\" (an integer from 0 to 4294967295: namespace)");
        assert!(err(&M, json!({"nqn": "n", "nsid": null})).contains("missing parameter \"nsid\""));
        let none: Method = Method { params: &[], ..M };
        assert!(err(&none, json!({"x": 1})).contains("set_it takes no parameters"));
    }

    #[test]
    fn nested_tables_are_checked_and_named_by_path() {
        let v = T
            .check(&json!({"nqn": "s", "hosts": ["h1", {"nqn": "h2"}], "namespace": [{"nsid": "2", "grow": "true"}]}))
            .unwrap();
        assert_eq!(v["namespace"][0], json!({"nsid": 2, "grow": true}));
        assert_eq!(v["hosts"], json!(["h1", {"nqn": "h2"}]));
        let e = err(&T, json!({"nqn": "s", "namespace": [{"nsid": 1}, {"nsid": 2, "blocksize": 4096}]}));
        assert!(
            e.starts_with("add_it: unknown parameter \"namespace[1].blocksize\" (did you mean \"size\"?); namespace[1] takes nsid,"),
            "{e}"
        );
        let e = err(&T, json!({"nqn": "s", "namespace": [{"nsid": "two"}]}));
        assert_eq!(e, "add_it: namespace[0].nsid: expected an integer from 0 to 4294967295, got \"two\"");
        let e = err(&T, json!({"nqn": "s", "hosts": [{"nqn": "h", "dhchap_kye": "x"}]}));
        assert!(e.contains("\"hosts[0].dhchap_kye\" (did you mean \"dhchap_key\"?)"), "{e}");
        let e = err(&T, json!({"nqn": "s", "hosts": [7]}));
        assert!(e.contains("hosts[0]: expected a string or a table (a JSON object), got 7"), "{e}");
        let e = err(&T, json!({"nqn": "s", "hosts": "h1"}));
        assert!(e.contains("hosts: expected an array, got \"h1\" (on the command line, key:='[...]'"), "{e}");
    }

    #[test]
    fn redaction_hides_secrets_at_any_depth_and_unknown_values() {
        let r = T.redacted(&json!({
            "nqn": "s",
            "hosts": ["h1", {"nqn": "h2", "dhchap_key": "DHHC-1:00:SECRET:"}],
            "dhchap_secret": "DHHC-1:00:OTHER:",
        }));
        let text = r.to_string();
        assert!(!text.contains("SECRET") && !text.contains("OTHER"), "{text}");
        assert_eq!(r["hosts"][1]["dhchap_key"], "<secret>");
        assert_eq!(r["hosts"][0], "h1");
        assert_eq!(r["dhchap_secret"], "<not shown>");
        assert_eq!(M.redacted(&json!({"nqn": "n", "key": "k"}))["key"], "<secret>");
    }

    #[test]
    fn describe_gives_types_defaults_and_never_a_secret() {
        let d = M.describe();
        assert_eq!(d["name"], "set_it");
        assert_eq!(d["changes"], "configuration");
        assert_eq!(
            d["params"][1],
            json!({
                "name": "nsid", "type": "integer", "minimum": 0, "maximum": u32::MAX,
                "required": true, "description": "namespace", "secret": false,
            })
        );
        assert_eq!(d["params"][2]["default"], 0);
        assert_eq!(d["params"][5]["values"], json!(["optimized", "inaccessible"]));
        assert_eq!(d["params"][7]["secret"], true);
        let t = T.describe();
        assert_eq!(t["params"][1]["items"]["one_of"][1]["fields"][1]["secret"], true);
        let all = describe(&[M, T]);
        assert_eq!(all[0]["name"], GET_METHODS);
        assert_eq!(all.as_array().unwrap().len(), 3);
    }

    #[test]
    fn unknown_methods_get_the_closest_name() {
        let methods = [M, T];
        assert_eq!(find(&methods, "add_it").unwrap().name, "add_it");
        let e = find(&methods, "set_iy").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.to_string().contains("unknown method \"set_iy\" (did you mean \"set_it\"?)"), "{e}");
        assert!(find(&methods, "help").unwrap_err().to_string().contains("rpc_get_methods lists them"));
        assert!(check_get_methods(&json!({})).is_ok());
        assert!(check_get_methods(&json!({"x": 1})).is_err());
    }

    #[test]
    fn closest_names() {
        let names = ["iops", "bytes_per_sec", "delay_us", "nsid", "block_size"];
        assert_eq!(closest("iops_limit", names), Some("iops"));
        assert_eq!(closest("blocksize", names), Some("block_size"));
        assert_eq!(closest("delay", names), Some("delay_us"));
        assert_eq!(closest("NSID", names), Some("nsid"));
        assert_eq!(closest("colour", names), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("nsdi", "nsid"), 1);
    }
}
