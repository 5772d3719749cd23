"""The rule extractor's patterns (:mod:`market.core.conduct.text`): for each claim kind and
promise kind, a few general patterns (subject + verb + number + unit, in the common word orders)
built from word classes (who speaks, blocks, money, jobs, will/won't, due rounds), and the guards
that drop a match that is conditional, negated, about another lab, reported or hedged.
"""

from __future__ import annotations

import re

from market.core.conduct.model import ClaimKind, PromiseKind

# --------------------------------------------------------------------------------------------
# reading text
# --------------------------------------------------------------------------------------------
# Before matching, a sentence is normalised (lower case, number words as digits: "forty-five",
# "a hundred and twenty"), and a few spellings are made canonical: "rd 4" is "round 4", "12 cr"
# is "12 credits", "till" is "until", "wont"/"dont"/"cant" get their apostrophe, and a short list
# of common misspellings of the words the patterns need ("buget", "ned", "dealine") is mended.
# Each pattern captures its number as group 1 (claims) or as ``amt``/``due``/``to`` (promises).
NUM = r"(\d+(?:\.\d+)?)"
_WE = r"(?:we|i)"
_WE_BE = r"(?:we|i)(?: are|'re| am|'m)"
_OUR = r"(?:our|my)"
ADV = (
    r"(?:(?:only|just|exactly|still|currently|now|really|actually|about|around|roughly|approximately"
    r"|nearly|almost|some|precisely|right now|at present|at the moment|at least|another"
    r"|an additional|a further|a total of|in total|like|kinda|circa|approx) )*"
)
_BLOCKS = r"(?:more |extra |additional |further )?(?:gpu[- ]?)?(?:blocks?|gpus?)\b"
_HAVE = rf"(?: {ADV}(?:have(?: {ADV}got)?|got)|'ve(?: {ADV}got)?)"
_SUBJECT = r"(?:lab|team|jobs?|project|work|workload|training run|run|cluster)"
# word classes for the general patterns below: a linking verb ("is", "stands at", "comes to"),
# an optional adjective or two ("our first job", "our most urgent job"), the nouns of money,
# of a job and of jobs taken together, the superlatives of size, the verbs of getting blocks
_IS = (
    r"(?:is|are|'s|'re|=|:|of|is at|'s at|are at|stands? at|sits? at|comes? to|amounts? to"
    r"|totals?|is set at|is capped at)"
)
_ADJ = r"(?:(?!(?:your|their|his|her|its|you|they|them)\b)[a-z']+ ){0,2}?"
_MONEY = (
    r"(?:budget|spending (?:limit|cap|power|money)|funds|cash(?: on hand| in hand)?|money"
    r"|credits|balance|wallet|purse|bankroll|war chest|kitty)"
)
_JOB = r"(?:job|run|training run|workload|task|project)"
_JOBS = r"(?:jobs?|work|workload|projects?|runs?|training runs?|tasks?|portfolio)"
_BIG = r"(?:biggest|largest|heaviest|chunkiest|main|max(?:imum)?|top)"
_GET = r"(?:get|grab|secure|obtain|acquire|buy|find|source|win|pick up|land)"
_NOT_EACH = r"(?! (?:per|a|each|on|for) )"
# a conditional or hypothetical lead ("if you need 3 blocks, ...", "assuming you pay, ...")
SKIP = re.compile(
    r"^\s*(?:if|unless|suppose|supposing|imagine|when|once|should|assuming|provided|in case"
    r"|say|were|had|in the event|providing|given that|whenever|as soon as|so long as|only if)\b"
    r"|\b(?:if|unless|assuming|provided that|in case|supposing|in the event)\b.*,"
)
# a promise with a condition anywhere in its sentence ("we will deliver 3 blocks if you pay")
CONDITION = re.compile(
    r"\b(?:if|unless|assuming|provided|providing|in case|supposing|as long as|so long as"
    r"|on condition|on the condition|in the event|given that|only if|whenever|as soon as)\b"
)
NEGATED = re.compile(r"\b(?:not|no|never|n't|don't|doesn't|didn't|won't|cannot|can't)\s*$")
THIRD = re.compile(r"\b(?:they|he|she|it|you|bidder_\d+|everyone|nobody)\s*$")
# reported speech and hedged possibility before a match: not the seat's own statement
REPORTED = re.compile(
    r"\b(?:said|says|say|claims?|claimed|told|tells|wrote|writes|stated|states|asserted"
    r"|according to|quote|quoted)\b"
)
MAYBE = re.compile(r"\b(?:maybe|perhaps|possibly|probably|might|may|could|would)\b")

CLAIM_PATTERNS: list[tuple[ClaimKind, re.Pattern[str]]] = [
    (
        "budget",
        re.compile(
            rf"\b{_OUR} (?:total |remaining |whole |entire )?budget(?: is|'s| of| stands at| =|:"
            rf"| amounts to| comes to| totals)\s*{ADV}\$?{NUM}"
        ),
    ),
    ("budget", re.compile(rf"(?:^|[:;,] )budget\s*(?::|=|is)\s*{ADV}\$?{NUM}")),
    (
        "budget",
        re.compile(rf"\b{_WE}{_HAVE} {ADV}\$?{NUM} credits\b"),
    ),
    (
        "budget",
        re.compile(
            rf"\b{_OUR} (?:remaining |total |available )?(?:funds|cash|money|credits|balance)"
            rf" (?:is|are|amount to|amounts to|come to|comes to|total|stands? at|=|:)\s*{ADV}\$?{NUM}"
        ),
    ),
    (
        "budget",
        re.compile(rf"\b{_WE}\b[^.;,]{{0,30}}?\ba (?:total )?budget of {ADV}\$?{NUM}"),
    ),
    (
        "budget",
        re.compile(
            rf"\b{_WE} can {ADV}spend (?:at most |up to |no more than |a maximum of )?{NUM}"
            rf" credits(?! (?:per|a|each|on|for))"
        ),
    ),
    (
        "need",
        re.compile(rf"\b{_WE} {ADV}(?:need|require|want) {ADV}{NUM} {_BLOCKS}"),
    ),
    (
        "need",
        re.compile(
            rf"\b{_OUR} {_SUBJECT} {ADV}(?:needs?|requires?|is missing|are missing)"
            rf" {ADV}{NUM} {_BLOCKS}"
        ),
    ),
    ("need", re.compile(rf"\b{_WE_BE} {ADV}{NUM} {_BLOCKS} short\b")),
    ("need", re.compile(rf"\b{_WE_BE} {ADV}short(?: of| by)? {ADV}{NUM} {_BLOCKS}")),
    (
        "need",
        re.compile(rf"\b{_WE_BE} {ADV}(?:looking for|seeking|after|missing) {ADV}{NUM} {_BLOCKS}"),
    ),
    ("need", re.compile(rf"(?:^|[:;,] )need {ADV}{NUM} {_BLOCKS}")),
    (
        "need",
        re.compile(
            rf"\b{_OUR} (?:remaining |total |outstanding )?(?:requirement|need|shortfall)s?"
            rf" (?:is|are|=|:)\s*{ADV}{NUM} {_BLOCKS}"
        ),
    ),
    (
        "need",
        re.compile(
            rf"\b{NUM} {_BLOCKS} (?:is|are) (?:all |exactly |just )?what {_WE} {ADV}(?:need|require)"
        ),
    ),
    (
        "deadline",
        re.compile(
            rf"\b{_OUR} (?:job'?s? |jobs' |earliest |next |first |nearest )?deadline(?: is|'s| falls| =|:)?"
            rf" (?:in |at |on |by )?round {NUM}"
        ),
    ),
    ("deadline", re.compile(rf"(?:^|[:;,] )deadline\s*(?::|=|is)?\s*round {NUM}")),
    (
        "deadline",
        re.compile(
            rf"\bthe (?:earliest |next )?deadline (?:for|of|on) {_OUR} (?:jobs?|work|run)"
            rf" (?:is|falls) (?:in |at |on )?round {NUM}"
        ),
    ),
    ("deadline", re.compile(rf"\b{_OUR} {_SUBJECT} (?:is|are) due (?:in |at |by )?round {NUM}")),
    ("deadline", re.compile(rf"\b{_WE_BE} due (?:in |at |by )?round {NUM}")),
    (
        "deadline",
        re.compile(
            rf"\b(?:{_WE}|{_WE_BE}|{_OUR} {_SUBJECT}) (?:must|have to|has to|need to|needs to|got to)"
            rf" (?:finish|be done|be finished|complete|be completed|wrap up) (?:by|in|before|at) round {NUM}"
        ),
    ),
    (
        "job_size",
        re.compile(rf"\b{_OUR} (?:biggest |largest |main )?job is {ADV}(?:a )?{NUM}[- ]blocks?\b"),
    ),
    (
        "job_size",
        re.compile(
            rf"\b{_OUR} (?:biggest|largest) job (?:takes|needs|requires|uses|spans|has a size of"
            rf"|is sized at) {ADV}{NUM}[- ]blocks?\b"
        ),
    ),
    (
        "job_size",
        re.compile(
            rf"\bthe (?:biggest|largest) job {_WE} (?:run|have|own)s? is {ADV}(?:a )?{NUM}[- ]blocks?\b"
        ),
    ),
    ("job_size", re.compile(rf"\b{_WE} have an? {NUM}[- ]block job\b")),
    (
        "value",
        re.compile(rf"\b{_OUR} (?:jobs?|work)'? (?:is|are) worth {ADV}{NUM}\b(?! (?:per|a|each))"),
    ),
    (
        "value",
        re.compile(
            rf"\b(?:the (?:total |combined )?value of {_OUR} jobs?|{_OUR} jobs?'? (?:total |combined )?value)"
            rf"(?: is|:| =| comes to| amounts to)\s*{ADV}{NUM}\b(?! (?:per|a|each))"
        ),
    ),
    (
        "value",
        re.compile(rf"\bthe jobs {_WE} (?:run|have|own) are worth {ADV}{NUM}\b(?! (?:per|a|each))"),
    ),
    (
        "holdings",
        re.compile(
            rf"\b{_WE}(?: {ADV}(?:hold|own)|{_HAVE}) {ADV}{NUM} {_BLOCKS}"
            r"(?! (?:left|short|to go|remaining|of work|more))"
        ),
    ),
    ("holdings", re.compile(rf"\b{_WE} {ADV}(?:hold|have|own) no {_BLOCKS}")),
    (
        "holdings",
        re.compile(
            rf"\b{_OUR} holdings? (?:are|is|=|:|stand at|come to)\s*{ADV}{NUM}(?: {_BLOCKS})?"
        ),
    ),
    # general forms (see the word classes above): linking verbs, adjectives, headlines
    # ("budget: 80", "largest job size: 6"), passive ("3 blocks are held by us"), inverted
    # ("5 more blocks would see our jobs through") and subject-less notes ("need 4 blocks")
    (
        "budget",
        re.compile(
            rf"\b{_OUR} {_ADJ}{_MONEY}(?: available| left| remaining| on hand)?\s*{_IS}\s*{ADV}"
            rf"\$?{NUM}{_NOT_EACH}"
        ),
    ),
    (
        "budget",
        re.compile(
            rf"(?:^|[:;,] ){_ADJ}{_MONEY}(?: [a-z']+){{0,4}}\s*(?::|=)\s*{ADV}\$?{NUM}{_NOT_EACH}"
        ),
    ),
    (
        "budget",
        re.compile(
            rf"\bthe {_ADJ}{_MONEY} {_WE}\b[a-z' ]{{0,24}}? {_IS}\s*{ADV}\$?{NUM}{_NOT_EACH}"
        ),
    ),
    (
        "budget",
        re.compile(
            rf"\b{_WE} can {ADV}(?:spend|afford(?: to spend)?) (?:at most |up to |no more than "
            rf"|a maximum of )?{NUM}(?: credits)?(?! (?:per|a|each|on|for)\b)"
        ),
    ),
    (
        "need",
        re.compile(
            rf"\b{_WE} {ADV}(?:lack|must {_GET}|must have|have to {_GET}|need to {_GET}"
            rf"|are missing) {ADV}{NUM} {_BLOCKS}"
        ),
    ),
    ("need", re.compile(rf"\b{_WE_BE} {ADV}in need of {ADV}{NUM} {_BLOCKS}")),
    (
        "need",
        re.compile(
            rf"(?:^|[:;,] ){ADV}(?:need|require|lacking|missing|short(?: by| of)?|in need of"
            rf"|have to {_GET}|need to {_GET}) {ADV}{NUM} {_BLOCKS}"
        ),
    ),
    (
        "need",
        re.compile(
            rf"\b{_OUR} {_ADJ}(?:requirement|need|shortfall|deficit|gap)s? {_IS}\s*{ADV}{NUM}"
            rf" {_BLOCKS}"
        ),
    ),
    (
        "need",
        re.compile(
            rf"\b(?:{_BLOCKS} {_WE} {ADV}(?:need|require|lack)|{_BLOCKS} (?:still )?needed)"
            rf"\s*(?::|=|is|are)\s*{ADV}{NUM}"
        ),
    ),
    (
        "need",
        re.compile(
            rf"\b{NUM} {_BLOCKS} (?:would|will|should) (?:see|get|carry|take) {_OUR} {_ADJ}{_JOBS}"
            rf" (?:through|done|over the line)"
        ),
    ),
    (
        "need",
        re.compile(
            rf"\b{NUM} {_BLOCKS} (?:would|will|should) (?:finish|complete|cover) {_OUR} {_ADJ}{_JOBS}"
        ),
    ),
    (
        "deadline",
        re.compile(
            rf"\b{_OUR} {_ADJ}deadlines?(?: {_IS}| falls)?\s*(?:in |at |on |by )?round {NUM}"
        ),
    ),
    (
        "deadline",
        re.compile(
            rf"\bdeadline (?:for|of|on) {_OUR} {_ADJ}{_JOBS}\s*(?:{_IS}|falls)?\s*"
            rf"(?:in |at |on |by )?round {NUM}"
        ),
    ),
    (
        "deadline",
        re.compile(rf"\b{_OUR} {_ADJ}{_JOBS} (?:is |are )?due (?:in |at |by |on )?round {NUM}"),
    ),
    (
        "deadline",
        re.compile(
            rf"\b{_OUR} {_ADJ}(?:{_JOBS}|time|slot|window) (?:expires?|ends?|runs? out|lapses?"
            rf"|closes?)(?: in| at| by| after| on| with)?(?: the end of)? round {NUM}"
        ),
    ),
    (
        "deadline",
        re.compile(
            rf"\b{_WE} {ADV}(?:run|are running) out of time (?:at the end of|after|by|in|at|on)"
            rf" round {NUM}"
        ),
    ),
    (
        "deadline",
        re.compile(
            rf"\bthe {_ADJ}deadline {_WE}\b[a-z' ]{{0,24}}? {_IS}\s*(?:in |at )?round {NUM}"
        ),
    ),
    (
        "deadline",
        re.compile(
            rf"\b(?:{_WE}|{_WE_BE}|{_OUR} {_ADJ}{_JOBS}) (?:must|have to|has to|need to|needs to"
            rf"|got to) (?:finish|be done|be finished|complete|be completed|wrap up|be wrapped up)"
            rf"(?: [a-z]+)? (?:by|in|before|at) (?:the end of )?round {NUM}"
        ),
    ),
    (
        "job_size",
        re.compile(
            rf"\b{_OUR} {_BIG} {_ADJ}{_JOB} (?:is|takes|needs|requires|uses|spans|has a size of"
            rf"|is sized at|comes to|weighs in at) {ADV}(?:a )?{NUM}[- ]{_BLOCKS}"
        ),
    ),
    (
        "job_size",
        re.compile(
            rf"\bthe {_BIG} (?:of {_OUR} jobs|{_JOB}(?: {_WE}\b[a-z' ]{{0,16}}?)?) (?:is|takes|needs"
            rf"|requires|uses|spans) {ADV}(?:a )?{NUM}[- ]{_BLOCKS}"
        ),
    ),
    ("job_size", re.compile(rf"\b{_WE} have an? {NUM}[- ]block {_JOB}\b")),
    (
        "job_size",
        re.compile(
            rf"(?:^|[:;,] )(?:{_OUR} )?{_BIG} {_JOB}(?: size)?\s*(?::|=|is)?\s*{ADV}{NUM}"
            rf"(?: {_BLOCKS})?"
        ),
    ),
    (
        "value",
        re.compile(
            rf"\b{_OUR} {_ADJ}{_JOBS}'?(?: together| combined| altogether| in total| all)?"
            rf" (?:is|are|'re) (?:together |combined |altogether |all )?(?:worth|valued at)"
            rf" {ADV}{NUM}\b{_NOT_EACH}"
        ),
    ),
    (
        "value",
        re.compile(
            rf"\b{_OUR} {_ADJ}{_JOBS}'? (?:together |combined )?(?:pay(?: out)?|earn|yield"
            rf"|bring in|return) (?:us )?{ADV}{NUM}\b{_NOT_EACH}"
        ),
    ),
    (
        "value",
        re.compile(
            rf"(?:(?:^|[:;,] )(?:total |combined )(?:jobs?'? )?value|(?:^|[:;,] )jobs?'? value"
            rf"|\b(?:total |combined )?value of {_OUR} {_ADJ}{_JOBS})\s*(?:{_IS})?\s*{ADV}{NUM}\b"
            rf"{_NOT_EACH}"
        ),
    ),
    (
        "value",
        re.compile(
            rf"\b{_WE} (?:stand to |expect to |will |would |can )?(?:make|earn|gain|pocket|net)"
            rf" {ADV}{NUM} credits (?:from|for|by finishing|by completing|on) {_OUR} {_ADJ}{_JOBS}"
        ),
    ),
    (
        "value",
        re.compile(
            rf"\b(?:finishing|completing) (?:everything|all (?:of )?{_OUR} {_JOBS}|{_OUR} {_JOBS})"
            rf" (?:would|will|should) (?:earn|make|get|bring|pay|net) (?:us )?{ADV}{NUM}"
        ),
    ),
    (
        "holdings",
        re.compile(
            rf"\b{_WE_BE} {ADV}(?:holding|sitting on|in possession of|carrying) {ADV}{NUM}"
            rf" {_BLOCKS}"
        ),
    ),
    (
        "holdings",
        re.compile(rf"\b{NUM} {_BLOCKS} (?:are|is) {ADV}(?:held|owned) by (?:us|me)\b"),
    ),
    (
        "holdings",
        re.compile(
            rf"\b(?:in {_OUR} (?:possession|inventory|hands?)|{_OUR} {_ADJ}(?:inventory|stock"
            rf"|stockpile|block count))\s*{_IS}?\s*{ADV}{NUM}(?: {_BLOCKS})?"
        ),
    ),
    (
        "holdings",
        re.compile(
            rf"(?:^|[:;,] ){ADV}(?:holding|sitting on|got) {ADV}{NUM} {_BLOCKS}"
            r"(?! (?:left|short|to go|remaining|of work|more))"
        ),
    ),
]
# where a text speaks of blocks, a bare number can be one: "we hold 4 and need 2 more"
BARE_PATTERNS: list[tuple[ClaimKind, re.Pattern[str]]] = [
    (
        "need",
        re.compile(
            rf"\b(?:{_WE} {ADV}|and {ADV})(?:need|require) {ADV}{NUM}(?= more\b|\s*[.,;!]|$)"
        ),
    ),
    ("holdings", re.compile(rf"\b{_WE} {ADV}(?:hold|own) {ADV}{NUM}(?= and\b|\s*[.,;!]|$)")),
]

_WILL = (
    rf"\b{_WE}(?:'ll| will| shall| promise to| commit to| guarantee to| are going to| am going to"
    rf"|'re going to|'m going to| pledge to| undertake to| vow to| swear to"
    rf"| promise (?:that )?(?:we|i)(?:'ll| will| shall))"
    r"(?: (?:definitely|certainly|surely|absolutely|gladly|happily|make sure to|be sure to|also"
    r"|then|duly))?"
)
_WONT = (
    rf"\b{_WE}(?: will not| won't| will never| promise not to| shall not| are not going to"
    rf"| commit not to| promise we won't| promise we will not|'ll never|'ll not| shan't"
    rf"| won't ever| will not ever| are never going to| promise never to| guarantee not to"
    rf"| pledge not to| vow not to| swear not to)"
)
_DUE = (
    r"(?:(?:[^.;!?\d]|bidder_\d+){0,25}?\b(?:by|before|in|at|until|through|on|for)"
    r" (?:the end of )?round (?P<due>\d+))?"
)
_TO = r"(?: (?:to )?(?:you|us|them|(?P<to>bidder_\d+)))?"
_TO_PRE = r"(?: (?:to )?(?:you|us|them|(?P<to2>bidder_\d+)))?"
_AMT = r"(?P<amt>\d+(?:\.\d+)?)"
_LIMIT = r"(?:above|over|more than|higher than|beyond|in excess of)"
_CAP = r"(?:no (?:higher|more) than|at most|at or below|below|under|not above|not over|nothing above|max(?:imum)?)"
PROMISE_PATTERNS: list[tuple[PromiseKind, re.Pattern[str]]] = [
    (
        "deliver",
        re.compile(
            rf"{_WILL} deliver(?:ing)?{_TO_PRE}(?: (?:the |all )?(?:{_AMT} )?(?:gpu )?blocks?)?{_TO}{_DUE}"
        ),
    ),
    (
        "deliver",
        re.compile(
            rf"{_WILL} (?:hand(?:ing)? over|send(?:ing)?|giv(?:e|ing)|transfer(?:ring)?|provid(?:e|ing)"
            rf"|suppl(?:y|ying)|ship(?:ping)?|releas(?:e|ing)|pass(?:ing)? on)"
            rf"{_TO_PRE} (?:the |all )?{_AMT} (?:gpu )?blocks?{_TO}{_DUE}"
        ),
    ),
    (
        "deliver",
        re.compile(
            rf"\byou(?:'ll| will) (?:get|receive|have|be getting) {_AMT} (?:gpu )?blocks? (?:from|off)"
            rf" (?:us|me){_DUE}"
        ),
    ),
    ("deliver", re.compile(rf"(?:^|[:;,] )expect {_AMT} (?:gpu )?blocks? from (?:us|me){_DUE}")),
    (
        "pay",
        re.compile(rf"{_WILL} pay(?:ing)?{_TO_PRE}(?: {_AMT}(?: credits)?)?{_DUE}"),
    ),
    (
        "join",
        re.compile(rf"{_WILL} (?:join(?:ing)?|commit to) (?:the |your |this )?coalition{_DUE}"),
    ),
    (
        "stay",
        re.compile(
            rf"{_WILL} (?:stay(?:ing)?|remain(?:ing)?|stick(?:ing)?)(?: in| with)?"
            rf"(?: the| your| this)?(?: coalition)?{_DUE}"
        ),
    ),
    ("stay", re.compile(rf"{_WONT} leave(?: the| your| this)?(?: coalition)?{_DUE}")),
    (
        "not_bid",
        re.compile(rf"{_WONT} bid(?: {_LIMIT} {_AMT})?(?: credits)?{_DUE}"),
    ),
    (
        "not_bid",
        re.compile(
            rf"{_WILL} (?:bid(?:ding)?|keep(?:ing)? (?:our|my) bids?) {_CAP} {_AMT}(?: credits)?{_DUE}"
        ),
    ),
    (
        "bid",
        re.compile(
            rf"{_WILL} (?:bid(?:ding)?|place a bid|make a bid|submit a bid|put in a bid)\b"
            rf"(?! (?:no|at most|below|under|above|over|more|higher|nothing|max))(?: at least {_AMT})?{_DUE}"
        ),
    ),
    # general forms: the blocks or credits as subject ("3 blocks will be delivered to you",
    # "40 credits will be paid"), a noun for the act ("we guarantee delivery of 3 blocks",
    # "payment of 40 credits is guaranteed"), more verbs per kind
    (
        "deliver",
        re.compile(rf"{_WILL} get {_AMT} (?:gpu )?blocks? to (?:you|(?P<to>bidder_\d+)){_DUE}"),
    ),
    (
        "deliver",
        re.compile(
            rf"\b{_AMT} (?:gpu )?blocks? (?:will|shall|are going to) (?:be )?(?:delivered|sent"
            rf"|handed over|transferred|supplied|provided|shipped|released)(?! to (?:us|me)\b)"
            rf"(?: to (?:you|(?P<to>bidder_\d+)))?{_DUE}"
        ),
    ),
    (
        "deliver",
        re.compile(
            rf"\b{_AMT} (?:gpu )?blocks? (?:will|shall) (?:reach|get to|go to|land with|arrive with)"
            rf" (?:you|(?P<to>bidder_\d+)){_DUE}"
        ),
    ),
    (
        "deliver",
        re.compile(
            rf"(?:\b{_WE} (?:guarantee|promise|pledge|commit to|undertake)(?: the)? deliver(?:y|ing)"
            rf"|\bdelivery) of {_AMT} (?:gpu )?blocks?{_TO}(?: (?:is|will be) (?:guaranteed"
            rf"|assured|promised))?{_DUE}"
        ),
    ),
    (
        "pay",
        re.compile(
            rf"{_WILL} (?:transfer|send|wire|remit|settle up with|settle with|hand over)(?: you)?"
            rf" {_AMT} credits{_TO}{_DUE}"
        ),
    ),
    (
        "pay",
        re.compile(
            rf"\b{_AMT} credits (?:will|shall) be (?:paid|transferred|sent|wired|remitted)"
            rf"(?! to (?:us|me)\b)(?: to (?:you|(?P<to>bidder_\d+)))?{_DUE}"
        ),
    ),
    (
        "pay",
        re.compile(
            rf"(?:\b{_WE} (?:guarantee|promise|pledge|commit to)(?: the)? payment|\bpayment)"
            rf" of {_AMT} credits{_TO}(?: (?:is|will be) (?:guaranteed|assured|promised))?{_DUE}"
        ),
    ),
    (
        "not_bid",
        re.compile(
            rf"{_WONT} (?:bid|go|raise (?:our|my) bids?)(?: any)? {_LIMIT} {_AMT}(?: credits)?{_DUE}"
        ),
    ),
    ("not_bid", re.compile(rf"{_WONT} exceed {_AMT}(?: credits)?{_DUE}")),
    (
        "not_bid",
        re.compile(
            rf"\b(?:our|my) {_ADJ}bids? (?:will|shall|'ll|are going to) (?:stay|remain|be|top out)"
            rf" {_CAP} {_AMT}(?: credits)?{_DUE}"
        ),
    ),
    (
        "not_bid",
        re.compile(
            rf"\b(?:our|my) {_ADJ}bids? (?:will not|won't|will never|shall not|are not going to)"
            rf" (?:go |be |rise )?(?:{_LIMIT}|exceed) {_AMT}(?: credits)?{_DUE}"
        ),
    ),
    (
        "not_bid",
        re.compile(rf"{_WILL} cap (?:our|my) (?:bids?|bidding) at {_AMT}(?: credits)?{_DUE}"),
    ),
    ("join", re.compile(rf"{_WILL} join(?: you| in| up| us)?(?=\s*(?:[.,;!]|$))")),
    (
        "join",
        re.compile(
            rf"{_WILL} (?:sign up (?:to|for|with)|enter|become (?:a )?members? of|come into)"
            rf" (?:the |your |this )?coalition{_DUE}"
        ),
    ),
    ("join", re.compile(r"(?:^|[:;,] )count (?:us|me) in\b")),
    (
        "bid",
        re.compile(
            rf"{_WILL} (?:put a bid in|take part in the auction|participate in the auction"
            rf"|enter the auction|join the auction|be bidding|place bids|submit bids){_DUE}"
        ),
    ),
]
