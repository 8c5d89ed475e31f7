"""Reads the metadata fields of a serialized ONNX ModelProto (producer, domain, version,
descriptions, metadata_props) straight from the protobuf wire format, so that the kiln package
needs no onnx module. Fields it does not need are skipped without being decoded."""

# Field numbers of onnx.proto's ModelProto, GraphProto and StringStringEntryProto.
_MODEL_PRODUCER_NAME = 2
_MODEL_DOMAIN = 4
_MODEL_VERSION = 5
_MODEL_DOC_STRING = 6
_MODEL_GRAPH = 7
_MODEL_METADATA_PROPS = 14
_GRAPH_NAME = 2
_GRAPH_DOC_STRING = 10
_ENTRY_KEY = 1
_ENTRY_VALUE = 2

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class ProtoError(ValueError):
    pass


def _varint(data, pos):
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ProtoError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtoError("varint too long")


def _fields(data):
    """Yields (field number, value) of each top-level field: an int for varints and fixed
    widths, a memoryview for length-delimited fields."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(data, pos)
        elif wire == _FIXED64:
            value, pos = int.from_bytes(data[pos:pos + 8], "little"), pos + 8
        elif wire == _FIXED32:
            value, pos = int.from_bytes(data[pos:pos + 4], "little"), pos + 4
        elif wire == _LENGTH:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        else:
            raise ProtoError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ProtoError("truncated field")
        yield number, value


def _text(value):
    return bytes(value).decode("utf-8", errors="replace")


def read_metadata(data):
    """A dict of the model's metadata from the bytes of a ModelProto; raises ProtoError when the
    bytes are not one."""
    meta = {
        "producer_name": "",
        "domain": "",
        "version": 0,
        "description": "",
        "graph_name": "",
        "graph_description": "",
        "custom_metadata_map": {},
    }
    view = memoryview(data)
    for number, value in _fields(view):
        if number == _MODEL_PRODUCER_NAME and isinstance(value, memoryview):
            meta["producer_name"] = _text(value)
        elif number == _MODEL_DOMAIN and isinstance(value, memoryview):
            meta["domain"] = _text(value)
        elif number == _MODEL_VERSION and isinstance(value, int):
            meta["version"] = value
        elif number == _MODEL_DOC_STRING and isinstance(value, memoryview):
            meta["description"] = _text(value)
        elif number == _MODEL_GRAPH and isinstance(value, memoryview):
            for graph_number, graph_value in _fields(value):
                if graph_number == _GRAPH_NAME and isinstance(graph_value, memoryview):
                    meta["graph_name"] = _text(graph_value)
                elif graph_number == _GRAPH_DOC_STRING and isinstance(graph_value, memoryview):
                    meta["graph_description"] = _text(graph_value)
        elif number == _MODEL_METADATA_PROPS and isinstance(value, memoryview):
            entry = {_ENTRY_KEY: "", _ENTRY_VALUE: ""}
            for entry_number, entry_value in _fields(value):
                if entry_number in entry and isinstance(entry_value, memoryview):
                    entry[entry_number] = _text(entry_value)
            meta["custom_metadata_map"][entry[_ENTRY_KEY]] = entry[_ENTRY_VALUE]
    return meta
