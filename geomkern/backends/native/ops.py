"""Native (csrc/) implementations, registered with the dispatcher."""
