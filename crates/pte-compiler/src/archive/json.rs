//! The JSON documents of a torch 2.15 `.pt2` archive (`torch/_export/serde/schema.py`, schema
//! version 8), as far as the compiler reads them. Unions are objects with exactly one key,
//! which serde's externally tagged enums match; floats may be the strings `"Infinity"`,
//! `"-Infinity"` and `"NaN"`.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};

/// A float that may be written as a string for non-finite values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Float(pub f64);

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Num(f64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Num(v) => Ok(Float(v)),
            Repr::Text(t) => match t.as_str() {
                "Infinity" => Ok(Float(f64::INFINITY)),
                "-Infinity" => Ok(Float(f64::NEG_INFINITY)),
                "NaN" => Ok(Float(f64::NAN)),
                _ => Err(serde::de::Error::custom(format!("not a float: {t:?}"))),
            },
        }
    }
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct ExportedProgram {
    pub graph_module: GraphModule,
    #[serde(default)]
    pub range_constraints: BTreeMap<String, RangeConstraint>,
    pub schema_version: SchemaVersion,
    #[serde(default)]
    pub torch_version: String,
    #[serde(default)]
    pub verifiers: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct SchemaVersion {
    pub major: i64,
    pub minor: i64,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct RangeConstraint {
    pub min_val: Option<i64>,
    pub max_val: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct GraphModule {
    pub graph: Graph,
    pub signature: GraphSignature,
    #[serde(default)]
    pub module_call_graph: Vec<ModuleCallEntry>,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct ModuleCallEntry {
    pub fqn: String,
    pub signature: Option<ModuleCallSignature>,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct ModuleCallSignature {
    pub in_spec: String,
    pub out_spec: String,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct Graph {
    pub inputs: Vec<Argument>,
    pub outputs: Vec<Argument>,
    pub nodes: Vec<Node>,
    #[serde(default)]
    pub tensor_values: BTreeMap<String, TensorMeta>,
    #[serde(default)]
    pub sym_int_values: BTreeMap<String, SymInt>,
    #[serde(default)]
    pub sym_bool_values: BTreeMap<String, IgnoredAny>,
    #[serde(default)]
    pub sym_float_values: BTreeMap<String, IgnoredAny>,
    #[serde(default)]
    pub is_single_tensor_return: bool,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct Node {
    pub target: String,
    pub inputs: Vec<NamedArgument>,
    pub outputs: Vec<Argument>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct NamedArgument {
    pub name: String,
    pub arg: Argument,
    #[serde(default)]
    pub kind: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct TensorMeta {
    pub dtype: i64,
    pub sizes: Vec<SymInt>,
    pub strides: Vec<SymInt>,
    #[serde(default)]
    pub storage_offset: Option<SymInt>,
    #[serde(default)]
    pub device: Option<Device>,
    #[serde(default)]
    pub layout: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct Device {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub index: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SymInt {
    AsExpr(SymExpr),
    AsInt(i64),
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct SymExpr {
    pub expr_str: String,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct TensorArgument {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SymIntArgument {
    AsName(String),
    AsInt(i64),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SymFloatArgument {
    AsName(String),
    AsFloat(Float),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum SymBoolArgument {
    AsName(String),
    AsBool(bool),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum OptionalTensorArgument {
    AsTensor(TensorArgument),
    AsNone(IgnoredAny),
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct GraphArgument {
    pub name: String,
    pub graph: Box<Graph>,
}

/// An argument or output (a union in the export schema).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Argument {
    AsNone(IgnoredAny),
    AsTensor(TensorArgument),
    AsTensors(Vec<TensorArgument>),
    AsInt(i64),
    AsInts(Vec<i64>),
    AsFloat(Float),
    AsFloats(Vec<Float>),
    AsString(String),
    AsStrings(Vec<String>),
    AsSymInt(SymIntArgument),
    AsSymInts(Vec<SymIntArgument>),
    AsScalarType(i64),
    AsMemoryFormat(i64),
    AsLayout(i64),
    AsDevice(Device),
    AsBool(bool),
    AsBools(Vec<bool>),
    AsSymBool(SymBoolArgument),
    AsSymBools(Vec<SymBoolArgument>),
    AsGraph(GraphArgument),
    AsOptionalTensors(Vec<OptionalTensorArgument>),
    AsCustomObj(IgnoredAny),
    AsOperator(String),
    AsSymFloat(SymFloatArgument),
    AsSymFloats(Vec<SymFloatArgument>),
    AsOptionalTensor(OptionalTensorArgument),
    AsComplex(IgnoredAny),
    AsNestedTensors(IgnoredAny),
    AsIntLists(IgnoredAny),
    AsStringToArgument(IgnoredAny),
    AsFloatLists(IgnoredAny),
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct GraphSignature {
    pub input_specs: Vec<InputSpec>,
    pub output_specs: Vec<OutputSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum InputSpec {
    UserInput {
        arg: Argument,
    },
    Parameter {
        arg: TensorArgument,
        parameter_name: String,
    },
    Buffer {
        arg: TensorArgument,
        buffer_name: String,
        #[serde(default)]
        persistent: Option<bool>,
    },
    TensorConstant {
        arg: TensorArgument,
        tensor_constant_name: String,
    },
    CustomObj(IgnoredAny),
    Token(IgnoredAny),
    ConstantInput {
        name: String,
        value: ConstantValue,
    },
}

/// The value a non-tensor input was specialised to.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum ConstantValue {
    AsNone(IgnoredAny),
    AsInt(i64),
    AsFloat(Float),
    AsString(String),
    AsBool(bool),
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum OutputSpec {
    UserOutput {
        arg: Argument,
    },
    LossOutput(IgnoredAny),
    BufferMutation {
        arg: TensorArgument,
        buffer_name: String,
    },
    GradientToParameter(IgnoredAny),
    GradientToUserInput(IgnoredAny),
    UserInputMutation {
        arg: TensorArgument,
        user_input_name: String,
    },
    Token(IgnoredAny),
    ParameterMutation {
        arg: TensorArgument,
        parameter_name: String,
    },
}

/// `data/weights/<model>_weights_config.json` and `data/constants/<model>_constants_config.json`.
#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct PayloadConfig {
    pub config: BTreeMap<String, PayloadMeta>,
}

#[derive(Debug, Deserialize)]
#[allow(missing_docs)]
pub struct PayloadMeta {
    pub path_name: String,
    #[serde(default)]
    pub is_param: bool,
    #[serde(default)]
    pub use_pickle: bool,
    pub tensor_meta: Option<TensorMeta>,
}
