"""Rendering a conversation with its chat template and masking the tokens that carry loss, one
module per concern; ``transforms.instruction.chat_template`` is the entry point."""
