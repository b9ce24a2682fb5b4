/**
 * The text the generated models' byte-level BPE is trained on: a few KB of
 * plain English written for this project, so the tokenizer is deterministic,
 * needs no download, and merges the byte pairs of ordinary prose ("th", " the",
 * "ing"). Changing this text changes every generated tokenizer and model
 * fingerprint, so treat it as frozen.
 */
export const BPE_CORPUS = `The river starts as a thin line of water high in the hills. In the spring the snow melts, and the water runs
down through the stones and the roots of the old trees. By the time it reaches the town it is wide and slow, and
children throw bread to the ducks that wait near the bridge. In the evening the light turns gold on the water, and
the people who walk along the bank stop to watch the birds come home.

A library is a quiet place, but it is never still. Someone is always looking for a book, reading a page, or
writing a note in the margin of a notebook. The shelves hold stories about kings and farmers, about ships that
crossed the sea, about the stars and the small things that live under a leaf. When you open a book you are
listening to a person who may have lived a thousand years ago, and yet the words still reach you.

Cooking is a kind of patient chemistry. You heat the pan, add a little oil, and wait until it shimmers. The onions
go in first, then the garlic, and the kitchen fills with a smell that brings everyone to the table. Good bread needs
flour, water, salt and time. The dough rises slowly in a warm room, and the baker folds it again and again until it
is smooth and strong.

Computers follow instructions exactly. A program is a list of steps: read the input, compute a result, write the
output. When a program is fast, it is usually because it does not repeat work it has already done. It keeps the
results it will need again in a cache, close at hand, and it only goes back to the slow storage when it must.
Memory is arranged in pages, and each page holds a fixed number of rows. When a page is no longer needed, it is
returned to the pool so that another request can use it.

A language model reads a sequence of tokens and predicts the next one. Each token looks back at the tokens before
it through attention, and the keys and values it computes are stored so that the next step does not have to compute
them again. A long prompt that many people share, such as a set of instructions or a document, can be computed once
and then reused, which saves time and energy. The answer must be the same whether the state was computed a moment
ago, restored from a disk, or fetched from another machine across the network.

On Monday the weather was cold and grey. On Tuesday the wind came from the west and the clouds moved quickly across
the sky. By Wednesday the sun was out, and the streets were full of people walking to work, talking on their phones,
and carrying cups of hot coffee. Thursday brought rain again, heavy and loud on the roofs, and on Friday the whole
city smelled of wet earth and fresh leaves.

The teacher asked the class a simple question: what makes a good answer? One student said that a good answer is
short. Another said that it must be true. A third said that it should help the person who asked. The teacher smiled
and wrote all three on the board, and then she added a fourth: a good answer explains why, so that the next question
is easier to answer.

Numbers have their own music. One, two, three, four, five, six, seven, eight, nine, ten. Twenty, thirty, forty, fifty,
one hundred, one thousand. The year has twelve months and the week has seven days. A minute has sixty seconds, and an
hour has sixty minutes. If you count slowly to one hundred you will notice how the rhythm of the words changes as the
numbers grow larger.

In the garden there are tomatoes, beans, carrots and a row of tall sunflowers that turn their faces to follow the
sun. The bees move from flower to flower, and in the late summer the branches of the apple tree bend low under the
weight of the fruit. Every autumn the leaves fall, the soil rests through the winter, and in the spring the work of
planting begins again.

Questions and answers: What is your name? My name is Ada. Where do you live? I live near the sea. What do you do?
I build machines that help people think. Why do you like it? Because every problem is a small puzzle, and when the
pieces fit together the whole thing works, and that is a good feeling. Thank you for your time. You are welcome.
`;
