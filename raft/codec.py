"""Versioned encoding of replicated commands (never pickle).

CONTRACT (implemented by a helper; other modules depend on these names):

    CODEC_VERSION = 1
    class CodecError(PermanentError)             # message names the field and the problem
    def encode(cmd: Command | LeaseCommand) -> bytes
    def decode(data: bytes) -> Command | LeaseCommand
    def encode_state(state: ControlState, lease: LeaseRecord) -> bytes    # snapshots
    def decode_state(data: bytes) -> tuple[ControlState, LeaseRecord]
"""
