"""A project-made, diverse prompt set, generated from templates and word lists (stage a).

Categories: conversation, coding, maths, writing, extraction, reasoning, roleplay, knowledge.
Every prompt is built here from this file's own lists; no evaluation set (MT-bench, HumanEval,
...) is read or imitated verbatim. `make_prompts(n, seed)` is deterministic.
"""

from __future__ import annotations

import random

TOPICS = [
    "climate change", "the French Revolution", "photosynthesis", "black holes", "the stock market",
    "machine learning", "the Roman Empire", "volcanoes", "honey bees", "the human heart",
    "renewable energy", "the printing press", "jazz music", "coral reefs", "the internet",
    "vaccines", "ancient Egypt", "electric cars", "the water cycle", "democracy", "chess",
    "coffee", "the moon landing", "earthquakes", "social media", "the Renaissance", "sleep",
    "inflation", "rainforests", "the immune system", "cryptography", "the Silk Road", "glaciers",
    "nutrition", "quantum computing", "urban gardening", "the Olympic Games", "bridges",
    "language learning", "meditation", "tea", "the periodic table", "dinosaurs", "public libraries",
    "recycling", "space telescopes", "the history of writing", "antibiotics", "wind turbines",
    "video games", "the Great Wall of China", "tides", "fungi", "remote work", "the violin",
    "bread baking", "penguins", "solar eclipses", "microplastics", "the Amazon river",
]
PEOPLE = [
    "a nurse", "a software engineer", "a farmer", "a high-school teacher", "a retired pilot",
    "a chef", "a student", "a small business owner", "a librarian", "a firefighter", "an artist",
    "a musician", "a scientist", "a travel blogger", "a parent of two", "a marathon runner",
]
OBJECTS = [
    "an old lighthouse", "a lost key", "a talking cat", "a broken clock", "a secret garden",
    "a time machine", "a mysterious letter", "a robot dog", "a haunted library", "a paper boat",
    "a dragon egg", "a forgotten city", "a magic violin", "a rainy train station", "a tiny island",
]
LANGS = ["Python", "JavaScript", "C", "C++", "Java", "Rust", "Go", "TypeScript", "SQL", "Bash"]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "finds the largest element in a list",
    "counts the vowels in a sentence", "merges two sorted lists", "computes the factorial of n",
    "removes duplicates from a list while keeping order", "checks whether a word is a palindrome",
    "returns the n-th Fibonacci number", "sorts a list of dictionaries by a key",
    "reads a CSV file and sums a column", "computes the average of numbers in a file",
    "finds the most common word in a text", "converts Celsius to Fahrenheit",
    "validates an email address", "implements binary search", "flattens a nested list",
    "computes the greatest common divisor of two numbers", "transposes a matrix",
    "counts the lines in a file", "implements a stack with push and pop",
    "finds all anagrams of a word in a list", "parses a date string", "implements bubble sort",
    "checks whether parentheses are balanced", "computes the dot product of two vectors",
    "returns the second smallest number in a list", "capitalizes every word in a sentence",
    "generates all subsets of a set", "implements a simple LRU cache",
]
CONCEPTS = [
    "recursion", "closures", "big-O notation", "hash tables", "linked lists", "garbage collection",
    "threads versus processes", "REST APIs", "unit testing", "version control with git",
    "object-oriented programming", "dynamic programming", "database indexes", "regular expressions",
    "memory leaks", "async/await", "type systems", "compilers versus interpreters",
]
TONES = ["formal", "friendly", "humorous", "persuasive", "concise", "enthusiastic", "calm"]
FORMS = [
    "a short story", "a poem", "a haiku", "a blog post", "a product description", "a speech",
    "a limerick", "a news article", "a diary entry", "a dialogue", "a song chorus", "a fable",
]
AUDIENCES = ["a five-year-old", "a high-school student", "an expert", "a tourist", "a beginner",
             "my grandmother", "a busy manager"]
CITIES = ["Paris", "Tokyo", "Cairo", "Lima", "Oslo", "Nairobi", "Sydney", "Toronto", "Hanoi",
          "Lisbon", "Mumbai", "Prague", "Seoul", "Mexico City", "Istanbul", "Vienna"]
NAMES = ["Alice", "Bob", "Carla", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal",
         "Kofi", "Lena", "Marco", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara"]
ROLES = ["a pirate captain", "a medieval knight", "a detective in 1920s London", "a space station AI",
         "a wise old wizard", "a grumpy shopkeeper", "a tour guide in Rome", "a job interviewer",
         "a personal fitness coach", "a museum curator", "a ship's cook", "a famous chef",
         "a customer support agent", "a time traveller from the year 3000", "a friendly robot"]
ITEMS = ["apples", "pencils", "books", "marbles", "cookies", "tickets", "coins", "stickers"]


def _conversation(r: random.Random) -> str:
    t = r.choice(TOPICS)
    return r.choice([
        f"What do you know about {t}?",
        f"Can you explain {t} to {r.choice(AUDIENCES)}?",
        f"I'm {r.choice(PEOPLE)}. How could {t} affect my daily life?",
        f"What are three interesting facts about {t}?",
        f"Give me some tips for a weekend trip to {r.choice(CITIES)}.",
        f"What are the pros and cons of {t}?",
        f"How do I get better at {r.choice(['cooking', 'public speaking', 'drawing', 'running', 'saving money', 'writing', 'studying', 'sleeping well'])}?",
        f"I feel {r.choice(['stressed', 'bored', 'unmotivated', 'nervous', 'tired'])} today. Any advice?",
        f"Why is {t} important?",
        f"Summarize the history of {t} in a few sentences.",
        f"What should {r.choice(PEOPLE)} know about {t}?",
        f"Recommend some good books about {t}.",
    ])


def _coding(r: random.Random) -> str:
    lang, task = r.choice(LANGS), r.choice(CODE_TASKS)
    return r.choice([
        f"Write a {lang} function that {task}.",
        f"How would I write a program in {lang} that {task}?",
        f"Explain {r.choice(CONCEPTS)} with an example in {lang}.",
        f"What is the difference between {r.choice(CONCEPTS)} and {r.choice(CONCEPTS)}?",
        f"Write a {lang} function that {task}, and explain its time complexity.",
        f"Here is my task: a program that {task}. Which language would you use and why?",
        f"Find the bug: def add(a, b): return a - b. It should add two numbers in {lang}.",
        f"Write unit tests for a function that {task}.",
        f"Explain {r.choice(CONCEPTS)} in simple terms.",
    ])


def _maths(r: random.Random) -> str:
    a, b, c = r.randint(2, 99), r.randint(2, 99), r.randint(2, 12)
    n1, n2 = r.choice(NAMES), r.choice(NAMES)
    item = r.choice(ITEMS)
    return r.choice([
        f"What is {a} times {b}?",
        f"Solve for x: {c}x + {a} = {b + a * c}.",
        f"{n1} has {a} {item} and gives {min(a, b)} to {n2}. How many {item} does {n1} have left?",
        f"A rectangle is {a} cm long and {b} cm wide. What is its area and perimeter?",
        f"What is {a}% of {b * 10}?",
        f"A train travels {a * 10} km in {c} hours. What is its average speed?",
        f"Is {a * b + 1} a prime number? Explain.",
        f"What is the sum of the integers from 1 to {a}?",
        f"If a shirt costs ${a} and is on sale for {c * 5}% off, what is the sale price?",
        f"Explain how to compute the derivative of x^{c}.",
        f"What is the probability of rolling a sum of {min(c, 12)} with two dice?",
        f"Convert {a * 3} kilometers to miles.",
    ])


def _writing(r: random.Random) -> str:
    form, tone = r.choice(FORMS), r.choice(TONES)
    return r.choice([
        f"Write {form} about {r.choice(OBJECTS)}.",
        f"Write {form} about {r.choice(TOPICS)} in a {tone} tone.",
        f"Write a {tone} email to my manager asking for a day off.",
        f"Compose {form} for {r.choice(AUDIENCES)} about {r.choice(TOPICS)}.",
        f"Write a {tone} cover letter for {r.choice(PEOPLE)} applying to a new job.",
        f"Draft a short speech for a friend's {r.choice(['wedding', 'birthday', 'retirement', 'graduation'])}.",
        f"Write a product description for {r.choice(OBJECTS)}.",
        f"Rewrite this sentence to be more {tone}: 'The meeting is moved to Friday.'",
        f"Write an opening paragraph for a novel set in {r.choice(CITIES)}.",
        f"Write a travel blog post about {r.choice(CITIES)}.",
    ])


def _extraction(r: random.Random) -> str:
    n1, n2, city = r.choice(NAMES), r.choice(NAMES), r.choice(CITIES)
    age, year = r.randint(18, 80), r.randint(1950, 2023)
    text = (f"{n1} ({age}) moved to {city} in {year} to work as {r.choice(PEOPLE)[2:]}. "
            f"There {n1} met {n2}, who studies {r.choice(TOPICS)}.")
    return r.choice([
        f"Extract all names, places and years from this text: {text}",
        f"Summarize in one sentence: {text}",
        f"Return a JSON object with the fields name, age, city and year from: {text}",
        f"List the people mentioned in this text and one fact about each: {text}",
        f"Classify the sentiment of this review as positive, negative or neutral: 'The {r.choice(ITEMS)} arrived late but {r.choice(['work great', 'were broken', 'are okay'])}.'",
        f"Turn this text into a bullet list of facts: {text}",
    ])


def _reasoning(r: random.Random) -> str:
    n1, n2, n3 = r.sample(NAMES, 3)
    return r.choice([
        f"{n1} is taller than {n2}, and {n2} is taller than {n3}. Who is the shortest?",
        f"If all {r.choice(ITEMS)} are red and some red things are round, are all {r.choice(ITEMS)} round?",
        f"{n1} is older than {n2}. {n3} is younger than {n2}. List them from oldest to youngest.",
        f"What would happen if {r.choice(TOPICS)} disappeared tomorrow? Think step by step.",
        f"A bat and a ball cost ${r.randint(2, 9)}.10 in total. The bat costs $1 more than the ball. How much is the ball?",
        f"Which is heavier, a kilogram of {r.choice(ITEMS)} or a kilogram of feathers?",
        f"Give a step-by-step plan to learn {r.choice(CONCEPTS)} in a month.",
        f"Compare {r.choice(TOPICS)} and {r.choice(TOPICS)}: how are they alike and different?",
        f"I have {r.randint(3, 9)} {r.choice(ITEMS)}. I eat two and buy three more. How many now? Explain.",
    ])


def _roleplay(r: random.Random) -> str:
    role = r.choice(ROLES)
    return r.choice([
        f"Pretend you are {role}. Introduce yourself.",
        f"You are {role}. Describe your typical day.",
        f"Act as {role} and give me advice about {r.choice(TOPICS)}.",
        f"As {role}, tell me a story about {r.choice(OBJECTS)}.",
        f"Role-play as {role}. I walk in and ask: 'What is happening here?'",
        f"Imagine you are {role} visiting {r.choice(CITIES)}. What do you see?",
    ])


CATEGORIES = {
    "conversation": _conversation,
    "coding": _coding,
    "maths": _maths,
    "writing": _writing,
    "extraction": _extraction,
    "reasoning": _reasoning,
    "roleplay": _roleplay,
}


STYLES = ("basic", "rich", "self")
ID_BASE = {"basic": 0, "rich": 100_000, "self": 200_000}
"""Prompt ids are unique across styles: training features are keyed by the response's prompt id,
and one work dir holds responses to every style. ("self" prompts are written by the model:
self_prompts.py.)"""


def prompt_style(prompt_id: int) -> str:
    """The style a prompt id belongs to (ids of a style start at its ID_BASE)."""
    return max((base, style) for style, base in ID_BASE.items() if prompt_id >= base)[1]


def make_prompts(num_prompts: int, seed: int = 0, style: str = "basic") -> list[dict]:
    """`num_prompts` distinct prompts, categories in rotation: [{"id", "category", "prompt"}].

    style "basic": this file's short one-request templates; "rich": rich_prompts.py's longer,
    multi-part and constrained ones."""
    if style == "basic":
        categories = CATEGORIES
    elif style == "rich":
        from eagle_core.train.rich_prompts import CATEGORIES as categories
    else:
        raise ValueError(f"prompt style {style!r}: expected basic or rich (self: self_prompts.py)")
    r = random.Random(seed)
    names = list(categories)
    seen: set[str] = set()
    out: list[dict] = []
    attempts = 0
    while len(out) < num_prompts and attempts < num_prompts * 50:
        category = names[attempts % len(names)]
        attempts += 1
        prompt = categories[category](r)
        if prompt in seen:
            continue
        seen.add(prompt)
        out.append({"id": ID_BASE[style] + len(out), "category": category, "prompt": prompt})
    return out
