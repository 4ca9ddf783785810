"""The "rich" prompt style: longer, multi-part, constrained requests (stage a, `prompts.style: rich`).

Why a second style: the first head's MT-bench acceptance (tau 1.79) trailed its acceptance on
held-out prompts of its own distribution (2.5) because the "basic" templates ask one short thing
at a time, while real chat traffic asks for long-form writing, explanations of STEM and humanities
subjects, role-play with a persona and several instructions in one message. These templates cover
those shapes. Every prompt is built from this file's own word lists (and prompts.py's); no
evaluation set is read or imitated verbatim. Deterministic for a given seed.
"""

from __future__ import annotations

import random

from eagle_core.train.prompts import (
    AUDIENCES,
    CITIES,
    CODE_TASKS,
    CONCEPTS,
    LANGS,
    NAMES,
    PEOPLE,
    ROLES,
    TOPICS,
)

STEM = [
    "entropy", "natural selection", "the Doppler effect", "plate tectonics", "CRISPR gene editing",
    "superconductivity", "the greenhouse effect", "neural networks", "nuclear fusion", "enzymes",
    "the speed of light", "semiconductors", "the Pythagorean theorem", "orbital mechanics",
    "antibiotic resistance", "ocean acidification", "the Krebs cycle", "radioactive decay",
    "lithium-ion batteries", "the placebo effect", "GPS satellites", "prime numbers",
    "public-key encryption", "the Higgs boson", "bacterial biofilms", "statistical significance",
    "compound interest", "heat pumps", "mRNA vaccines", "the carbon cycle", "Bayes' theorem",
    "friction", "the standard model of particle physics", "photosynthesis at the molecular level",
]
HUMANITIES = [
    "the causes of the First World War", "utilitarianism", "the Industrial Revolution",
    "Shakespeare's tragedies", "the Cold War", "impressionist painting", "stoicism",
    "the fall of the Western Roman Empire", "the civil rights movement", "supply and demand",
    "the Enlightenment", "colonialism in Africa", "Greek mythology", "the Meiji Restoration",
    "existentialism", "the Harlem Renaissance", "the Treaty of Westphalia", "game theory",
    "the ethics of artificial intelligence", "the origins of democracy in Athens",
    "the Ottoman Empire", "behavioral economics", "the Reformation", "minimalism in architecture",
    "the social contract", "the history of jazz", "globalization", "the Mongol Empire",
]
PRODUCTS = [
    "a solar-powered phone charger", "a language-learning app", "a smart water bottle",
    "a community bike-sharing scheme", "an electric cargo bike", "a meal-planning service",
    "a noise-cancelling sleep mask", "a plant-based burger", "a budgeting spreadsheet template",
    "a co-working space for parents", "a reusable coffee cup", "an online chess course",
]
CONSTRAINTS = [
    "Keep it under 150 words.", "Use exactly three bullet points.", "End with a question for the reader.",
    "Use a numbered list.", "Include one concrete example.", "Avoid technical jargon.",
    "Write at least four paragraphs.", "Start with a one-sentence summary.", "Use a table where it helps.",
    "Include a short analogy.", "Add a title.", "Finish with a one-line takeaway.",
    "Mention one common misconception.", "Address the reader directly.",
]
FOLLOW_UPS = [
    "Then summarize your answer in one sentence.", "Then list two sources a reader could consult.",
    "Then rewrite the first paragraph for a ten-year-old.", "Then give a counter-argument.",
    "Then suggest three follow-up questions.", "Then translate the last sentence into French.",
    "Then rate your own answer out of 10 and explain the score.",
]


def _plural(product: str) -> str:
    """'a smart water bottle' -> 'smart water bottles'."""
    return product.split(" ", 1)[1] + "s"


def _constraints(r: random.Random, k_max: int = 2) -> str:
    return " ".join(r.sample(CONSTRAINTS, r.randint(0, k_max)))


def _follow_up(r: random.Random) -> str:
    return r.choice(FOLLOW_UPS) if r.random() < 0.35 else ""


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _writing(r: random.Random) -> str:
    topic, city, product = r.choice(TOPICS), r.choice(CITIES), r.choice(PRODUCTS)
    base = r.choice([
        f"Write a travel blog post about a week in {city}, covering food, culture and one surprising moment.",
        f"Write a persuasive essay arguing that schools should teach more about {topic}.",
        f"Draft a professional email to a supplier explaining that an order of {_plural(product)} arrived damaged and asking for a replacement.",
        f"Write a short story in which {r.choice(PEOPLE)} discovers something unexpected about {topic}.",
        f"Write a product launch announcement for {product}, with a headline, three key features and a call to action.",
        f"Compose a heartfelt letter from a grandparent to a grandchild about {topic}.",
        f"Write a restaurant review of a small family-run place in {city}.",
        f"Write the opening scene of a mystery novel set in {city} during a storm.",
        f"Write a speech for the opening of a new public library, mentioning {topic}.",
        "Write a newsletter for a neighbourhood association announcing a clean-up day.",
        f"Write a poem about {topic} with four stanzas, each from a different season.",
        "Edit this paragraph for grammar and clarity, then explain your changes: 'Me and him goes to the market every sundays, we buys vegetable and talk with the peoples there.'",
    ])
    return _join(base, _constraints(r), _follow_up(r))


def _roleplay(r: random.Random) -> str:
    role, topic, city = r.choice(ROLES), r.choice(TOPICS), r.choice(CITIES)
    base = r.choice([
        f"Pretend you are {role}. A visitor asks you about {topic}. Stay in character and answer in detail.",
        f"You are {role}. Describe, in first person, the most difficult day of your career.",
        f"Act as {role} giving a welcome speech to new arrivals in {city}.",
        "Imagine you are a famous scientist from history. Explain your greatest discovery to a modern student.",
        "You are a sommelier. Recommend drinks for a dinner of three courses and explain each choice.",
        f"Play the role of a travel agent. I want a five-day trip to {city} on a tight budget. Ask me two questions, then propose an itinerary.",
        f"Take on the persona of a stand-up comedian and do a short routine about {topic}.",
        "You are a doctor. A patient describes trouble sleeping and headaches. Suggest lifestyle changes and when to seek further care.",
        f"Act as a debate coach. Give me the three strongest arguments for and against {topic} being taught in every school.",
        f"You are {role}. Write a diary entry about meeting {r.choice(NAMES)} for the first time.",
    ])
    return _join(base, _constraints(r, 1), _follow_up(r))


def _reasoning(r: random.Random) -> str:
    a, b, c, d = r.sample(NAMES, 4)
    n = r.randint(3, 9)
    base = r.choice([
        f"{a} is twice as old as {b}. In {n} years, the sum of their ages will be {6 * n + 2 * n}. How old are they now? Explain.",
        f"Should {r.choice(PEOPLE)} in {r.choice(CITIES)} buy a car or rely on public transport? Reason through costs, time and environmental impact.",
        f"{a} and {b} split a bill of ${n * 17}. {a} pays ${n * 4} more than {b}. How much does each pay? Explain step by step.",
        f"{a}, {b}, {c} and {d} sit in a row. {a} is not at either end, {b} sits right of {c}, and {d} is at the left end. Give every possible order and explain your reasoning.",
        f"In a race, {a} overtakes the person in second place. What position is {a} in now? Explain step by step.",
        f"A farmer has {n} sheep; all but {n - 2} run away. How many are left? Explain the trick in the question.",
        "Three boxes are labelled apples, oranges and mixed, and every label is wrong. You may take one fruit from one box. How do you relabel them correctly?",
        f"If it takes {n} machines {n} minutes to make {n} widgets, how long do {n * 10} machines take to make {n * 10} widgets? Show your reasoning.",
        f"{a} says '{b} is lying'. {b} says '{c} is lying'. {c} says 'both {a} and {b} are lying'. Who is telling the truth?",
        "A clock shows 3:15. What is the angle between the hour and minute hands? Explain.",
        "Evaluate this argument and name its flaw: 'Every time I carry an umbrella it does not rain, so carrying an umbrella prevents rain.'",
        f"Plan the fastest way for {n} people to cross a bridge at night with one torch, if at most two may cross together. Explain your assumptions.",
        f"What is the next number in the sequence {n}, {n * 2}, {n * 2 + 3}, {n * 4 + 6}, {n * 4 + 9}? Explain the pattern.",
    ])
    return _join(base, _follow_up(r))


def _maths(r: random.Random) -> str:
    a, b, c = r.randint(2, 40), r.randint(2, 40), r.randint(2, 9)
    base = r.choice([
        f"Solve the system of equations {c}x + y = {a} and x - y = {b}. Show each step.",
        f"A right triangle has legs of {a} cm and {b} cm. Find its hypotenuse, area and perimeter.",
        f"Find the derivative and the integral of f(x) = {c}x^3 - {a}x + {b}, and explain each rule you use.",
        f"A savings account pays {c}% interest per year, compounded yearly. How much will ${a * 100} become after {c + 1} years?",
        f"Two dice are rolled. What is the probability that the sum is at least {min(a % 11 + 2, 12)}? Explain.",
        "Prove that the sum of two odd numbers is even.",
        f"How many ways can {c} people be seated around a round table? Explain why it differs from a row.",
        f"The mean of five numbers is {a}. Four of them are {a - 2}, {a + 3}, {a - 1} and {a + 5}. What is the fifth?",
        f"A car accelerates from rest at {c} m/s^2 for {a % 10 + 2} seconds. How far does it travel and what is its final speed?",
        f"Find all integer solutions of x^2 - {c * c} = 0 and explain why there are no others.",
        f"A recipe for {c} people needs {a * 10} g of flour. How much is needed for {c + b % 7 + 1} people, and how did you scale it?",
    ])
    return _join(base, _follow_up(r))


def _coding(r: random.Random) -> str:
    lang, concept, task = r.choice(LANGS), r.choice(CONCEPTS), r.choice(CODE_TASKS)
    base = r.choice([
        f"Write a {lang} function that {task}. Handle edge cases, add comments, and show three example calls with their output.",
        f"Write a {lang} function that {task}, then write unit tests for it and explain what each test checks.",
        f"I wrote a {lang} function that {task}, but it is slow on large inputs. Explain how to profile it and what to optimize.",
        f"Compare two different ways to write a {lang} function that {task}, and say when each is better.",
        f"Implement a function in {lang} that returns the longest common subsequence of two strings. Explain its complexity.",
        f"Write a {lang} class for a bank account with deposit, withdraw and balance, rejecting overdrafts. Include example usage.",
        "Review this Python code and fix its bugs:\n```python\ndef average(xs):\n    total = 0\n    for i in range(1, len(xs)):\n        total += xs[i]\n    return total / len(xs)\n```",
        f"Explain {concept} and show a small {lang} example where it matters.",
        "Write a Python function that parses a log file, counts errors per hour, and prints a sorted report.",
        "Design a REST API for a to-do list application: list the endpoints, methods, request bodies and status codes.",
        "Write a SQL query that returns the three customers with the highest total order value, given tables customers(id, name) and orders(id, customer_id, amount).",
        f"Write a {lang} function to find the k-th largest element in an unsorted array, and explain why your approach is efficient.",
        f"Explain the difference between a process and a thread, then write a short {lang} example that uses one of them.",
        f"Write a function that checks whether a binary tree is balanced, in {lang}, with comments.",
        "Write a Bash script that backs up a directory into a dated tar.gz archive and deletes archives older than 7 days.",
        "Implement a simple tokenizer in Python that splits arithmetic expressions like '3 + 4*(2 - 1)' into tokens, with tests.",
    ])
    return _join(base, _follow_up(r))


def _extraction(r: random.Random) -> str:
    n1, n2, n3 = r.sample(NAMES, 3)
    c1, c2 = r.sample(CITIES, 2)
    year = r.randint(1990, 2024)
    text = (
        f"In {year}, {n1} founded a small company in {c1} that makes {_plural(r.choice(PRODUCTS))}. "
        f"Two years later {n2} joined as chief engineer, and sales grew by {r.randint(10, 90)}% after "
        f"the company opened an office in {c2}. {n3}, a long-time customer, said the product "
        f"'{r.choice(['changed how I work', 'was disappointing at first', 'is worth every penny'])}'. "
        f"The company now employs {r.randint(12, 400)} people."
    )
    base = r.choice([
        f"Read the text and return a JSON object with the founder, founding year, cities and number of employees.\n\n{text}",
        f"Summarize this text in two sentences, then list every number it contains with what it measures.\n\n{text}",
        f"From the text below, extract each person and their role, as a markdown table.\n\n{text}",
        f"Identify the sentiment of the customer's quote and explain your answer.\n\n{text}",
        f"Write three quiz questions (with answers) that test understanding of this text.\n\n{text}",
        f"Rewrite this text as a formal press release.\n\n{text}",
    ])
    return base


def _stem(r: random.Random) -> str:
    subject, aud = r.choice(STEM), r.choice(AUDIENCES)
    base = r.choice([
        f"Explain {subject} to {aud}.",
        f"What is {subject}, how was it discovered, and why does it matter today?",
        f"Describe {subject} and give two everyday examples of it.",
        f"What are the open questions or controversies around {subject}?",
        f"Compare {subject} with {r.choice(STEM)}: what do they have in common and how do they differ?",
        f"Design a simple experiment a student could do to illustrate {subject}. List materials and steps.",
        f"Write a short lesson plan for teaching {subject}, with learning goals and an activity.",
    ])
    return _join(base, _constraints(r), _follow_up(r))


def _humanities(r: random.Random) -> str:
    subject = r.choice(HUMANITIES)
    base = r.choice([
        f"Discuss {subject}: its main ideas or events, key figures, and lasting influence.",
        f"What were the causes and consequences of {subject}?",
        f"Explain {subject} to {r.choice(AUDIENCES)}, with one concrete example.",
        f"Write a balanced short essay on {subject}, presenting two opposing interpretations.",
        f"How does {subject} relate to {r.choice(HUMANITIES)}? Draw at least two connections.",
        f"Create a timeline of the most important moments of {subject}, with one sentence on each.",
        f"What can people today learn from {subject}?",
    ])
    return _join(base, _constraints(r), _follow_up(r))


CATEGORIES = {
    "writing": _writing,
    "roleplay": _roleplay,
    "reasoning": _reasoning,
    "maths": _maths,
    "coding": _coding,
    "extraction": _extraction,
    "stem": _stem,
    "humanities": _humanities,
}
