"""Word lists the generators draw from, written here by hand.

Everything a task shows is composed from these lists and the families' own templates,
never from benchmark files. The lists are long enough that combinations (two-part
station names, first × last names, adjective × noun products) give tens of thousands
of distinct surface forms, which is what keeps 10,000 generated items mostly distinct.
Names avoid the words the checkers parse on ("to", "take", tabs, commas in cells).
"""

from __future__ import annotations

# Word tables, many words a line: the formatter leaves them as written.
# fmt: off
FIRST_NAMES = (
    "Ana", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ines", "Jonas",
    "Kira", "Liam", "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara",
    "Umar", "Vera", "Wes", "Ximena", "Yusuf", "Zoe", "Arjun", "Bianca", "Cyrus", "Daria",
    "Emil", "Freya", "Gideon", "Hana", "Ivo", "Jade", "Kofi", "Lena", "Marco", "Nadia",
    "Oscar", "Priya", "Rafael", "Selma", "Tomas", "Uma", "Viktor", "Wren", "Yara", "Zeno",
    "Amara", "Bruno", "Celia", "Dario", "Esme", "Felix", "Gwen", "Hector", "Isla", "Jasper",
    "Keiko", "Luca", "Mira", "Nils", "Orla", "Petra", "Ravi", "Sofia", "Theo", "Ursula",
)

LAST_NAMES = (
    "Abbott", "Barros", "Castillo", "Dahl", "Eriksen", "Fischer", "Gallo", "Haddad",
    "Ivanova", "Jensen", "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov",
    "Quintero", "Rossi", "Sato", "Tanaka", "Ueda", "Varga", "Weber", "Xu", "Yilmaz",
    "Zimmer", "Alvarez", "Brennan", "Chen", "Dubois", "Esposito", "Ferreira", "Grant",
    "Holm", "Iqbal", "Jovanovic", "Keller", "Larsen", "Mendes", "Nakamura", "Olsen",
    "Pereira", "Reyes", "Schmidt", "Torres", "Vogel", "Walsh", "Young", "Zhang", "Bianchi",
    "Costa", "Dvorak", "Falk", "Horvat", "Kaur", "Lambert", "Marsh", "Nyberg", "Ortiz",
    "Park", "Ramos", "Silva", "Thorne", "Wolff",
)

CITIES = (
    "Aberdeen", "Bergen", "Cordoba", "Dresden", "Eindhoven", "Florence", "Graz", "Haarlem",
    "Izmir", "Jaipur", "Kyoto", "Lyon", "Malmo", "Nantes", "Oporto", "Perth", "Quebec",
    "Rennes", "Seville", "Tampere", "Utrecht", "Valencia", "Wellington", "Yokohama",
    "Zaragoza", "Antwerp", "Bilbao", "Cork", "Dundee", "Espoo", "Geneva", "Halifax",
    "Leeds", "Munich", "Nagoya", "Ottawa", "Pune", "Salzburg", "Trieste", "Vilnius",
)

DEPARTMENTS = (
    "Finance", "Legal", "Marketing", "Research", "Support", "Logistics", "Design",
    "Sales", "Engineering", "Operations", "Procurement", "Training", "Security", "Quality",
)

EMAIL_DOMAINS = (
    "example.org", "example.com", "mail.example.net", "corp.example", "team.example.io",
    "northwind.example", "bluepeak.example", "orchard.example",
)

ADJECTIVES = (
    "amber", "bold", "brisk", "calm", "clever", "cosy", "crisp", "dusky", "eager", "fancy",
    "gentle", "golden", "hardy", "humble", "jolly", "keen", "lively", "lucky", "mellow",
    "misty", "nimble", "noble", "plush", "quiet", "rapid", "royal", "rustic", "silver",
    "sleek", "snug", "solid", "sturdy", "sunny", "swift", "tidy", "urban", "vivid", "wild",
)

PRODUCT_NOUNS = (
    "kettle", "lamp", "backpack", "blender", "notebook", "umbrella", "helmet", "teapot",
    "headset", "toaster", "wallet", "scarf", "jacket", "mug", "chair", "desk", "pillow",
    "speaker", "charger", "bottle", "skillet", "planter", "mirror", "rug", "clock",
    "camera", "tripod", "keyboard", "monitor", "stool", "basket", "candle", "blanket",
)

CATEGORIES = ("Kitchen", "Office", "Outdoor", "Audio", "Home", "Travel", "Garden", "Apparel")

EVENT_WORDS_A = (
    "Spring", "Autumn", "Midnight", "Harbour", "Open", "Urban", "Coastal", "Winter",
    "Summer", "Riverside", "Annual", "Grand", "Late", "Weekend", "Northern", "Community",
)
EVENT_WORDS_B = (
    "Jazz", "Film", "Poetry", "Robotics", "Chess", "Craft", "Science", "Folk", "Design",
    "Comedy", "Cooking", "Startup", "Photo", "Theatre", "Gaming", "Book", "Dance", "Wine",
)
EVENT_WORDS_C = (
    "Night", "Fair", "Summit", "Festival", "Meetup", "Showcase", "Marathon", "Forum",
    "Workshop", "Gala", "Market", "Jam", "Expo", "Salon", "Circle", "Sessions",
)

VENUES = (
    "Town Hall", "Old Mill", "Glasshouse", "Corn Exchange", "Harbour Shed", "Civic Centre",
    "Lantern Room", "Guild Hall", "Velvet Lounge", "North Pavilion", "Arts Depot",
    "Riverside Barn", "Atrium", "Printworks", "Chapel Studio", "Granary",
)

BOOK_WORDS_A = (
    "The Silent", "A Distant", "The Last", "The Hidden", "Beyond the", "Under the",
    "The Paper", "The Winter", "Letters from the", "The Glass", "Songs of the", "The Iron",
    "Notes on the", "The Quiet", "Return to the", "Maps of the",
)
BOOK_WORDS_B = (
    "Orchard", "Harbour", "Archive", "Garden", "Lighthouse", "River", "Mountain", "Library",
    "Forest", "Station", "Island", "Bridge", "Valley", "Observatory", "Workshop", "Desert",
)

CUISINES = (
    "Thai", "Georgian", "Peruvian", "Lebanese", "Korean", "Ethiopian", "Basque", "Sicilian",
    "Vietnamese", "Mexican", "Nepali", "Portuguese", "Turkish", "Japanese", "Greek",
)
RESTAURANT_WORDS_A = (
    "Blue", "Little", "Golden", "Crooked", "Silver", "Red", "Wild", "Old", "Green", "Copper",
    "Lucky", "Salt", "Olive", "Saffron", "Cedar", "Ember",
)
RESTAURANT_WORDS_B = (
    "Spoon", "Lantern", "Fig", "Table", "Kettle", "Harbor", "Garden", "Pantry", "Oven",
    "Anchor", "Orchard", "Door", "Vine", "Bowl", "Hearth", "Pepper",
)
DISTRICTS = (
    "Old Town", "Harbourside", "Northgate", "Canal Quarter", "Hilltop", "Market District",
    "West End", "Riverbank", "Uptown", "Station Quarter", "Elm Park", "Docklands",
)

AIRPORT_CITIES = (
    "Oslo", "Lisbon", "Dublin", "Vienna", "Prague", "Athens", "Madrid", "Zurich", "Warsaw",
    "Helsinki", "Rome", "Berlin", "Paris", "Riga", "Tallinn", "Sofia", "Porto", "Milan",
)
AIRLINE_CODES = ("NX", "QA", "LF", "TR", "BK", "VZ", "HP", "EJ", "RO", "SK")

STATION_FIRST = (
    "Oak", "Maple", "Cedar", "Harbor", "Copper", "Stone", "Willow", "Birch", "Amber", "Iron",
    "Silver", "Lark", "Fox", "Heron", "Elm", "Ash", "Juniper", "Bramble", "Thistle", "Hazel",
    "Marsh", "Cobalt", "Granite", "Rowan", "Aspen", "Falcon", "Meadow", "Clover", "Saffron",
    "Linden", "Quarry", "Beacon", "Orchard", "Flint", "Poplar", "Kestrel", "Sparrow",
    "Cinder", "Pebble", "Thorn", "Wren", "Alder", "Basalt", "Chestnut", "Dove", "Ember",
)
STATION_SECOND = (
    "Hill", "Park", "Square", "Gate", "Market", "Bridge", "Junction", "Heights", "Crossing",
    "Quay", "Fields", "Green", "Cross", "Row", "Lane", "Wharf", "Common", "Yard", "Court",
    "Terrace", "Vale", "End", "Plaza", "Harbour", "Mill", "Works", "Dock", "Grove", "Point",
)

LINE_COLOURS = (
    "Red", "Amber", "Jade", "Violet", "Teal", "Crimson", "Indigo", "Ochre", "Olive",
    "Scarlet", "Cobalt", "Saffron", "Magenta", "Emerald", "Slate", "Coral", "Bronze", "Ivory",
)

WORDS = (
    "river", "stone", "light", "garden", "window", "market", "paper", "bridge", "music",
    "cloud", "forest", "letter", "engine", "silver", "harbor", "winter", "summer", "candle",
    "shadow", "mirror", "valley", "orange", "planet", "signal", "bottle", "ticket", "island",
    "anchor", "feather", "lantern", "meadow", "pepper", "rocket", "spiral", "thunder",
    "velvet", "whistle", "yellow", "basket", "copper", "dragon", "falcon", "glacier",
    "horizon", "journey", "kitten", "ladder", "marble", "needle", "ocean", "puzzle",
)
VERBS = (
    "carries", "finds", "paints", "follows", "watches", "builds", "crosses", "hides",
    "opens", "sings", "holds", "greets", "moves", "draws", "keeps", "meets", "lifts",
)
ARTICLES = ("the", "a", "one", "every", "that", "this")
# fmt: on
