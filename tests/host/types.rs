//! The ABI's enumerations (proxy-wasm 0.2.1), as the host sees them.

/// What a filter callback answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Let the data go on.
    Continue,
    /// Stop iteration (`Action::Pause` in the Rust SDK).
    Pause,
}

impl Action {
    pub(crate) fn from_abi(value: u32) -> Option<Action> {
        match value {
            0 => Some(Action::Continue),
            1 => Some(Action::Pause),
            _ => None,
        }
    }
}

/// Log levels of `proxy_log` (the SDK's numbering, which is also Envoy's spdlog order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Critical,
}

impl LogLevel {
    pub(crate) fn from_abi(value: u32) -> Option<LogLevel> {
        match value {
            0 => Some(LogLevel::Trace),
            1 => Some(LogLevel::Debug),
            2 => Some(LogLevel::Info),
            3 => Some(LogLevel::Warn),
            4 => Some(LogLevel::Error),
            5 => Some(LogLevel::Critical),
            _ => None,
        }
    }

    pub(crate) fn to_abi(self) -> u32 {
        match self {
            LogLevel::Trace => 0,
            LogLevel::Debug => 1,
            LogLevel::Info => 2,
            LogLevel::Warn => 3,
            LogLevel::Error => 4,
            LogLevel::Critical => 5,
        }
    }
}

/// `WasmResult` codes returned by host calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Ok = 0,
    NotFound = 1,
    BadArgument = 2,
    InvalidMemoryAccess = 6,
    CasMismatch = 8,
    InternalFailure = 10,
    Unimplemented = 12,
}

/// `proxy_get_header_map_*` map types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MapType {
    RequestHeaders,
    RequestTrailers,
    ResponseHeaders,
    ResponseTrailers,
    GrpcInitialMetadata,
    GrpcTrailingMetadata,
    HttpCallResponseHeaders,
    HttpCallResponseTrailers,
}

impl MapType {
    pub(crate) fn from_abi(value: u32) -> Option<MapType> {
        match value {
            0 => Some(MapType::RequestHeaders),
            1 => Some(MapType::RequestTrailers),
            2 => Some(MapType::ResponseHeaders),
            3 => Some(MapType::ResponseTrailers),
            4 => Some(MapType::GrpcInitialMetadata),
            5 => Some(MapType::GrpcTrailingMetadata),
            6 => Some(MapType::HttpCallResponseHeaders),
            7 => Some(MapType::HttpCallResponseTrailers),
            _ => None,
        }
    }
}

/// `proxy_get_buffer_bytes` buffer types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BufferType {
    RequestBody,
    ResponseBody,
    DownstreamData,
    UpstreamData,
    HttpCallResponseBody,
    GrpcReceiveBuffer,
    VmConfiguration,
    PluginConfiguration,
    CallData,
}

impl BufferType {
    pub(crate) fn from_abi(value: u32) -> Option<BufferType> {
        match value {
            0 => Some(BufferType::RequestBody),
            1 => Some(BufferType::ResponseBody),
            2 => Some(BufferType::DownstreamData),
            3 => Some(BufferType::UpstreamData),
            4 => Some(BufferType::HttpCallResponseBody),
            5 => Some(BufferType::GrpcReceiveBuffer),
            6 => Some(BufferType::VmConfiguration),
            7 => Some(BufferType::PluginConfiguration),
            8 => Some(BufferType::CallData),
            _ => None,
        }
    }
}

/// `proxy_continue_stream` / `proxy_close_stream` stream types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamType {
    Request,
    Response,
    Downstream,
    Upstream,
}

impl StreamType {
    pub(crate) fn from_abi(value: u32) -> Option<StreamType> {
        match value {
            0 => Some(StreamType::Request),
            1 => Some(StreamType::Response),
            2 => Some(StreamType::Downstream),
            3 => Some(StreamType::Upstream),
            _ => None,
        }
    }
}

/// Metric kinds of `proxy_define_metric`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
}

impl MetricType {
    pub(crate) fn from_abi(value: u32) -> Option<MetricType> {
        match value {
            0 => Some(MetricType::Counter),
            1 => Some(MetricType::Gauge),
            2 => Some(MetricType::Histogram),
            _ => None,
        }
    }

    /// The low bits Envoy puts in a metric id to tell its type.
    pub(crate) fn id_tag(self) -> u32 {
        match self {
            MetricType::Counter => 0,
            MetricType::Gauge => 1,
            MetricType::Histogram => 2,
        }
    }
}
