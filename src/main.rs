fn main() {
    println!("bloomery-serve");
}
