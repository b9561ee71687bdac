"""The fixed calibration set the FP8 quality gate runs: varied lengths, topics and scripts."""

CALIBRATION_TEXTS = [
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "How do I reset my password?",
    "To reset your password, open settings, choose security and follow the link we email you.",
    "A man is riding a white horse on an enclosed ground.",
    "The quarterly report shows revenue growth of 12 percent driven by cloud services.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "def quicksort(xs): return xs if len(xs) < 2 else quicksort([x for x in xs[1:] if x < xs[0]])",
    "Berlin ist die Hauptstadt Deutschlands und liegt an der Spree.",
    "东京是日本的首都，也是世界上人口最多的城市之一。",
    "La tour Eiffel a été construite pour l'Exposition universelle de 1889.",
    "Symptoms of dehydration include thirst, dark urine, fatigue and dizziness.",
    "The mitochondria is the powerhouse of the cell.",
    "Vector databases index embeddings for approximate nearest neighbour search.",
    "In 1969 Apollo 11 landed the first humans on the Moon.",
    "Use a token budget to batch requests of different lengths without padding.",
    "best pizza near me open now",
    "Transformers use self-attention to relate every token to every other token in a sequence, "
    "which lets them model long-range dependencies that recurrent networks struggle with. "
    "Training them at scale requires careful choices of learning rate, batch size and data.",
    "The patient was prescribed 500 mg of amoxicillin three times daily for seven days.",
    "Stock markets fell sharply after the central bank raised interest rates unexpectedly.",
    "¿Dónde está la estación de tren más cercana?",
    "Rain is expected tomorrow afternoon with temperatures around 14 degrees.",
    "The contract may be terminated by either party with thirty days written notice.",
    "Gradient descent updates parameters in the direction that reduces the loss.",
]
CALIBRATION_QUERIES = ["What is the capital of France?", "How do I reset my password?"]
