"""The gRPC API: generated protocol modules (``v1``) and the servicers."""
