"""A few dozen varied sentences: short, long past 128 and 256 tokens, non-ASCII, odd spacing."""

LONG = (
    "Embedding servers turn text into vectors so that search engines can compare meaning "
    "rather than words; a backfill pushes millions of documents through the model while "
    "users keep sending single queries that must come back in milliseconds. "
)

SENTENCES = [
    "Hello world",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "x",
    "?",
    "   leading and trailing spaces   ",
    "UPPER CASE TEXT SHOULD BE LOWERED BY THE TOKENIZER",
    "Numbers 1234567890 and symbols #@!$%^&*()",
    "Ünïcödé wörds: naïve café, São Paulo, Zürich, Øresund",
    "中文句子：今天天气很好。",
    "日本語の文章です。東京は日本の首都です。",
    "Русский текст о погоде и городах.",
    "العربية نص قصير",
    "emoji 🙂🚀 and ☃ snowmen",
    "tabs\tand\nnewlines\nin text",
    "a" * 300,
    LONG,
    LONG * 2,  # past 128 tokens (the tokenizer file's own limit)
    LONG * 6,  # past 256 tokens (the model's limit): truncated
    "The quick brown fox jumps over the lazy dog. " * 10,
    "Short query about embeddings",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "don't won't can't shouldn't y'all",
]
