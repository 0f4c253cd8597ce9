"""A trained model on the Hugging Face Hub: `model_card` renders and checks the card (the template
`hub_card.md`), `hub` builds the folder plain transformers loads and uploads it (`vaswani-push-to-hub`,
`vaswani-train --push_to_hub`)."""
