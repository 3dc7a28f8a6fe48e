"""What travels between GPUlayer's processes beside the JSON contracts: binary streams.

``kernels.py`` holds a GPU kernel's messages as they cross the wire (raw ZMQ multipart frames,
never base64 on a stream) and the framing of one stream message; ``stream.py`` is the client end
of a reliable stream over a WebSocket (numbered messages, acknowledgements, resends after a
reconnect, failover between URLs); ``api/streams.py`` is the server end.
"""
