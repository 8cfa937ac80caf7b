package sandbox
